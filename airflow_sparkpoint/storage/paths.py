"""Confining paths read from stored records (issue #28: trust nothing read from storage).

Transaction records, batch claims, replay records, lineage origins and run results
name paths relative to a root: a sink's staging area, a live checkpoint location, a
job's store. Whoever can write the place a record lives in can write any path into it,
so every such path goes through `confine` before it is joined to its root: one rule,
one function, used by every layer (this module imports nothing of Sparkpoint but its
errors).
"""

from __future__ import annotations

from airflow_sparkpoint.exceptions import InvalidPath, SparkpointError

__all__ = ["confine"]


def confine(path: object, *, under: str = "", what: str,
            error: type[SparkpointError] = InvalidPath, exact: bool = False) -> str:
    """The canonical form of `path` (a relative ``/``-separated path read from a record)
    once it is known to stay strictly inside the relative root `under` (``""``: anywhere
    inside the record's root, but never the root itself).

    The canonical form drops ``.`` and empty segments (and so a trailing ``/``): on a
    file system it names the same file, but an S3 key is literal (``a//b`` and ``a/b``
    are two objects), so a caller confining an S3 key passes `exact` and keeps its key.

    :param exact: refuse a `path` that is not already canonical instead of rewriting it.
    :param what: the record and field the path was read from, for the error message
        (e.g. ``"transaction orders-b3-g1 payload.staged.staging"``).
    :param error: the error to raise (a sink raises `SinkError`: a refused record is a
        failed commit, not a store failure whose outcome is unknown).
    :raises InvalidPath: (or `error`) `path` is not a string, is empty, absolute,
        contains ``..``, a backslash or NUL, is not inside `under`, or (`exact`) is not
        canonical; the message names `what` and `path`.
    """
    if not isinstance(path, str) or not path:
        raise error(f"{what} {path!r} is empty or not a string; expected a relative path inside its root")
    if path.startswith("/") or "\\" in path or "\x00" in path:
        raise error(f"{what} {path!r} is absolute or has a backslash or NUL; expected a relative path "
                          "inside its root")
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise error(f"{what} {path!r} climbs out with '..'; expected a relative path inside its root")
    canonical = "/".join(parts)
    base = "/".join(part for part in under.split("/") if part not in ("", "."))
    if not canonical or (base and not canonical.startswith(base + "/")):
        raise error(f"{what} {path!r} is not inside {base or 'its root'!r}; expected a path under it")
    if exact and canonical != path:
        raise error(f"{what} {path!r} is not canonical (an empty or '.' segment, or a trailing '/'); "
                    f"expected {canonical!r}, which names another object")
    return canonical
