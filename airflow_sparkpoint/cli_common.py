"""What the ``sparkpoint`` commands share: exit codes, the two CLI errors, argument
types, the common options, opening the job's catalog, and the text/JSON output helpers.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from airflow_sparkpoint.exceptions import ConfigError, SparkpointError, StorageError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2


class UsageError(SparkpointError):
    """Bad command-line input (exit code 2)."""


class CommandFailed(SparkpointError):
    """An operational failure already explained to the user (exit code 1)."""


# --------------------------------------------------------------------------- parser


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _positive_seconds(text: str) -> float:
    from airflow_sparkpoint import durations

    try:  # seconds, or a duration as Spark writes them ("5 minutes", "30s")
        value = durations.parse_text(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds nor a duration like '5 minutes'") \
            from None
    try:
        return durations.seconds("value", value)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a number of seconds > 0") from None


def _whole_number(what: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`, errors naming the value and `what`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a {what} >= {minimum}")
        return value

    return parse


_batch_id = _whole_number("batch id", 0)
_generation = _whole_number("generation", 1)


def _common_options(*, many_jobs: bool = False) -> argparse.ArgumentParser:
    """The options every command takes; with `many_jobs`, ``--job`` may be repeated."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("where the job lives")
    where.add_argument("--dir", default=_env("SPARKPOINT_DIR"), metavar="URI",
                       help="storage root: a path, file:///path or s3://bucket/prefix (default: $SPARKPOINT_DIR)")
    if many_jobs:
        where.add_argument("--job", dest="jobs", action="append", default=None, metavar="NAME",
                           help="pipeline name; repeat for several (default: $SPARKPOINT_JOB)")
    else:
        where.add_argument("--job", default=_env("SPARKPOINT_JOB"), metavar="NAME",
                           help="pipeline name (default: $SPARKPOINT_JOB)")
    where.add_argument("--s3-endpoint", default=_env("SPARKPOINT_S3_ENDPOINT"), metavar="URL",
                       help="S3-compatible endpoint, e.g. http://minio:9000 (default: $SPARKPOINT_S3_ENDPOINT); "
                            "credentials come from the standard AWS environment/config")
    where.add_argument("--s3-region", default=_env("SPARKPOINT_S3_REGION"), metavar="REGION",
                       help="S3 region (default: $SPARKPOINT_S3_REGION, then the AWS default)")
    output = common.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON document (shapes: docs/CLI.md)")
    output.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    return common



def _storage_options(args: argparse.Namespace) -> dict[str, Any]:
    from airflow_sparkpoint.storage.endpoints import s3_options

    return s3_options(args.s3_endpoint, args.s3_region)


def _open_catalog(args: argparse.Namespace) -> Any:
    """The job's catalog; fails fast on a missing root, bucket or unreachable endpoint."""
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.layout import validate_job_name
    from airflow_sparkpoint.storage import LocalStorage, open_storage, split_uri

    if not args.dir:
        raise UsageError("--dir is required (or set SPARKPOINT_DIR)")
    if not args.job:
        raise UsageError("--job is required (or set SPARKPOINT_JOB)")
    validate_job_name(args.job)
    scheme = split_uri(args.dir)[0]
    options = _storage_options(args) if scheme == "s3" else {}  # S3 options mean nothing to other roots
    storage = open_storage(args.dir, **options)
    if isinstance(storage, LocalStorage) and not os.path.isdir(storage.root):
        raise CommandFailed(f"storage root {args.dir!r} does not exist ({storage.root}); check --dir")
    storage.check()
    return Catalog(storage, args.job)


def _iso(epoch: float | None) -> str | None:
    from airflow_sparkpoint.checkpoints.display import iso

    return iso(epoch)


def _size(n: int | None) -> str:
    from airflow_sparkpoint.checkpoints.display import size

    return size(n)


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: frozenset[int] = frozenset()) -> str:
    """Left-aligned text columns, right-aligned number columns (indices in `right`)."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def _pairs(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in pairs)


def _listing(value: Any) -> Any:
    """Lists as ``2: a, b`` (``0`` when empty); anything else unchanged."""
    if isinstance(value, (list, tuple)):
        return f"{len(value)}: {', '.join(map(str, value))}" if value else "0"
    return value


def _emit_json(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def _other_jobs_hint(catalog: Any) -> str:
    try:
        names = [n for n in catalog.storage.list_dirs("") if n != catalog.job]
    except StorageError:
        return ""
    return f" (jobs under this root: {', '.join(names[:10])})" if names else ""


# --------------------------------------------------------------------------- list



def _lazy(module: str, name: str, command: str) -> Callable[..., Any]:
    """Import `module.name` on first use, with a clear message when it is missing."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module or module.startswith(missing + ".") or missing.startswith("airflow_sparkpoint"):
            raise CommandFailed(
                f"`sparkpoint {command}` is not available in this installation: module {missing or module} is "
                "missing (upgrade airflow-sparkpoint)"
            ) from None
        top = missing.split(".", 1)[0]
        raise CommandFailed(f"`sparkpoint {command}` needs the Python package {top!r}, which is not "
                            f"installed ({exc}); install it with: pip install {top}") from None
    function = getattr(loaded, name, None)
    if not callable(function):
        raise CommandFailed(f"`sparkpoint {command}` is not available in this installation: {module} has no "
                            f"{name}() (upgrade airflow-sparkpoint)")
    return function  # type: ignore[no-any-return]

