"""The directory of one spark-submit on the Airflow worker: the runtime archive shipped
with ``--py-files`` and the directory the driver's RocksDB extracts its native library to.

RocksJava copies its native library (≈ 15 MB) out of its jar at every JVM start, into a
new temporary file in ``java.io.tmpdir``, and deletes it only when the JVM exits cleanly.
Airflow's task supervisor sends SIGKILL 5 s after SIGTERM, and a driver killed that way
left its copy in ``/tmp``: a job retried for weeks fills the worker's disk. With
``ROCKSDB_SHAREDLIB_DIR`` set, RocksJava writes the library under a fixed name in that
directory instead. It must not be shared: each JVM deletes and rewrites the file there, so
a second driver starting beside a first would rewrite it under the first one's load.

So each submission gets a directory of its own (`open_submit_dir`), locked with an ``flock``
for the life of the task's process (the kernel drops it when the process dies, even by
SIGKILL). The task removes it when spark-submit has ended (`SubmitDir.close`); a task killed
before that leaves it, and the next submission on the worker removes every such
directory whose lock nobody holds (`sweep`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time
import zipfile
from pathlib import Path

from airflow_sparkpoint.runtime.livedir import LiveLock, try_lock

__all__ = ["PREFIX", "ROCKSDB_LIBRARY_DIR_ENV", "SWEEP_MIN_AGE_S", "SubmitDir", "build_runtime_zip",
           "open_submit_dir", "sweep", "with_runtime_zip"]

log = logging.getLogger(__name__)

PREFIX = "sparkpoint-submit-"
#: RocksJava's directory for its native library (the environment variable it reads)
ROCKSDB_LIBRARY_DIR_ENV = "ROCKSDB_SHAREDLIB_DIR"
#: a directory younger than this is never swept: its creator may be between creating and
#: locking it
SWEEP_MIN_AGE_S = 60.0


# Modules a Spark cluster needs; the Airflow layer stays behind.
_RUNTIME_PACKAGES = ("checkpoints", "runtime", "sinks", "storage")
_RUNTIME_MODULES = ("__init__.py", "durations.py", "exceptions.py", "faults.py", "process_exit.py",
                    "py.typed")


def build_runtime_zip(directory: str | None = None) -> str:
    """Zip the Spark-side runtime (storage, checkpoints, runtime, sinks) for ``--py-files``
    into a new file in `directory` (the temporary directory by default).

    The archive imports with no Airflow and no install of the provider; the caller
    deletes the returned file.
    """
    package = Path(__file__).resolve().parent.parent
    handle, path = tempfile.mkstemp(prefix="sparkpoint-runtime-", suffix=".zip", dir=directory)
    os.close(handle)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name in _RUNTIME_MODULES:
            if (package / name).exists():
                archive.write(package / name, f"airflow_sparkpoint/{name}")
        for sub in _RUNTIME_PACKAGES:
            for file in sorted((package / sub).rglob("*.py")):
                archive.write(file, f"airflow_sparkpoint/{file.relative_to(package).as_posix()}")
    return path


def with_runtime_zip(py_files: str | None, directory: str) -> str:
    """`py_files` (spark-submit's ``--py-files``, comma-separated) with a new runtime zip
    (`build_runtime_zip` in `directory`) added."""
    return ",".join(p for p in (py_files, build_runtime_zip(directory)) if p)


class SubmitDir:
    """One submission's directory, locked until `close` removes it."""

    def __init__(self, path: str, lock: LiveLock) -> None:
        self.path = path
        self._lock: LiveLock | None = lock

    @property
    def native_dir(self) -> str:
        """Where the driver's RocksDB extracts its native library (``ROCKSDB_SHAREDLIB_DIR``)."""
        return os.path.join(self.path, "native")

    @property
    def lock_fd(self) -> int | None:
        """The descriptor of the directory's lock (None once closed or handed over): a
        detached launcher inherits it and holds the lock for the driver's life."""
        return None if self._lock is None else self._lock.fd

    def hand_over(self) -> None:
        """Drop this process's hold on the lock without removing the directory: a
        detached launcher started with `lock_fd` holds the lock now, and the directory
        is swept once it and its driver have ended."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def close(self) -> None:
        """Remove the directory (what the driver left in it too) and drop the lock."""
        if self._lock is None:
            return
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.release()
        self._lock = None


def open_submit_dir(base: str | None = None) -> SubmitDir:
    """Sweep `base` (the temporary directory by default), then create and lock a new
    submission directory there with its ``native`` directory.

    :raises OSError: the directory cannot be created or locked.
    """
    base = base or tempfile.gettempdir()
    sweep(base)
    path = tempfile.mkdtemp(prefix=PREFIX, dir=base)
    lock = try_lock(path)
    if lock is None:  # a sweeper cannot hold it: the directory is younger than SWEEP_MIN_AGE_S
        raise OSError(f"the new submission directory {path} is locked by another process")
    made = SubmitDir(path, lock)
    os.mkdir(made.native_dir)
    return made


def sweep(base: str, *, min_age_s: float = SWEEP_MIN_AGE_S, now: float | None = None) -> list[str]:
    """Remove the submission directories in `base` whose task is gone (nobody holds their
    lock) and that are older than `min_age_s`; return their paths. Never raises: a
    directory that cannot be read or removed is left for the next sweep."""
    now = time.time() if now is None else now
    removed = []
    try:
        entries = list(os.scandir(base))
    except OSError:
        return []
    for entry in entries:
        try:
            if not entry.name.startswith(PREFIX) or not entry.is_dir(follow_symlinks=False):
                continue
            if now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            lock = try_lock(entry.path)
        except OSError:
            continue
        if lock is None:  # its task is alive
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
        finally:
            lock.release()
        removed.append(entry.path)
    if removed:
        log.info("removed %d submission directories of earlier submissions that were killed: %s",
                 len(removed), removed)
    return removed
