"""A process in a mount namespace of its own, as on another host: a private, empty /tmp
(a tmpfs) in which only the given directories of the real /tmp are seen again, each
through a bind mount at the same path (a shared NFS/EFS mount, as Spark workers of a
real cluster see it).

``unshare --mount`` needs root; the namespace ends with its last process (the worker and
everything it started: SIGKILL them by pid and it is gone). The real /tmp is reached while
the binds are made through `stash`, an empty directory outside /tmp, bound in the
namespace only and unmounted before the command starts.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

TMP = Path("/tmp")


def available() -> str | None:
    """Why a mount namespace cannot be made here, or None when it can."""
    if os.geteuid() != 0:
        return "unshare --mount needs root"
    if not shutil.which("unshare") or not shutil.which("mount"):
        return "unshare/mount not installed"
    return None


def installed_software() -> list[Path]:
    """The directories every host of a real cluster has installed (this checkout, the
    Python environment, Spark) that lie under /tmp (a fresh clone in /tmp, as CI makes):
    a private /tmp must see them again, or the worker cannot even start."""
    import pyspark

    found = {Path(__file__).resolve().parents[2], Path(sys.prefix).resolve(),
             Path(pyspark.__file__).resolve().parent}
    under_tmp = sorted(p for p in found if TMP in p.parents)
    return [p for p in under_tmp if not any(other in p.parents for other in under_tmp)]


def private_tmp(stash: Path, shared: Sequence[Path], private: Sequence[Path] = ()) -> list[str]:
    """The command prefix: run the command with a private /tmp where the `shared`
    directories (under /tmp) are bind mounts of the real ones and the `private` ones are
    new, empty directories.

    :raises ValueError: a directory is not under /tmp, or `stash` is.
    """
    for path in [*shared, *private]:
        if TMP not in Path(path).parents:
            raise ValueError(f"{path} is not under {TMP}: a private /tmp would not hide it")
    if TMP in stash.parents or stash == TMP:
        raise ValueError(f"stash {stash} must be outside {TMP}")
    lines = ["set -e", f"mount --bind /tmp {shlex.quote(str(stash))}",
             "mount -t tmpfs sparkpoint-private-tmp /tmp"]
    for path in [*installed_software(), *shared]:
        source = stash / Path(path).relative_to(TMP)
        lines += [f"mkdir -p {shlex.quote(str(path))}",
                  f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(path))}"]
    lines += [f"mkdir -p {shlex.quote(str(path))}" for path in private]
    lines += [f"umount {shlex.quote(str(stash))}", 'exec "$@"']
    return ["unshare", "--mount", "--propagation", "private", "--", "/bin/bash", "-c", "\n".join(lines),
            "mountns"]
