"""The restore drill as a use case (`SparkpointDrillOperator` and the blue-green
pre-flight run it through spark-submit): which snapshot is drilled, the drill's scratch
directory and output arguments, whether its run restored that snapshot, and the outcome
recorded next to the snapshot (``_verification.json``, level ``drill``).

The drill never claims a generation of the production job and never writes to its
sinks: every output argument is replaced (`drill_arguments`), and the drill runs under
its own job name in its own directory (`Scratch`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.layout import validate_job_name
from airflow_sparkpoint.checkpoints.verification import VerificationRecord
from airflow_sparkpoint.exceptions import (
    ConfigError,
    CorruptMetadata,
    DrillFailed,  # defined in the error tree; still importable from here (the same class)
    RestoreError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.runtime.config import PREFIX
from airflow_sparkpoint.storage import open_storage, split_uri

__all__ = ["FIXED_PARAMETERS", "LATEST_SAVEPOINT", "SCRATCH", "DrillFailed", "DrillOutcome", "Scratch",
           "check_drill_job", "check_parameters", "check_result", "drill_arguments", "drill_conf",
           "newest_savepoint", "record_drill", "resolve_drilled", "run_drill"]

log = logging.getLogger(__name__)

#: stands for the drill's own directory in an output argument's value
SCRATCH = "{scratch}"
#: the `snapshot` that drills the newest complete savepoint
LATEST_SAVEPOINT = "latest_savepoint"
#: the submit parameters a drill sets itself
FIXED_PARAMETERS = ("restore", "restore_snapshot", "trigger", "commit_mode", "sink", "emit_asset_events")


def check_parameters(owner: str, given: Iterable[str], output_args: Any) -> None:
    """A drill operator's parameters, when the DAG is parsed: none of `FIXED_PARAMETERS`
    among the `given` names, and `output_args` a non-empty mapping. `owner` names the
    operator class in the messages.

    :raises ConfigError: naming the parameter and what to do instead.
    """
    fixed = sorted(set(FIXED_PARAMETERS) & set(given))
    if fixed:
        raise ConfigError(f"{owner} sets {', '.join(fixed)} itself (a "
                          "drill restores `snapshot` "
                          "with trigger availableNow, commits in the job and writes "
                          "only scratch output, which "
                          "is no asset); remove the argument")
    if not isinstance(output_args, Mapping) or not output_args:
        raise ConfigError(f"{owner} needs output_args: the application "
                          "arguments through which "
                          "it writes, mapped to scratch locations (e.g. {'--output': "
                          "'{scratch}/out'}); without "
                          "them a drill would write to the production sinks")


def check_drill_job(job: str, drill_job: str) -> None:
    """:raises ConfigError: `drill_job` is no valid job name, or the production `job`'s."""
    validate_job_name(drill_job)
    if drill_job == job:
        raise ConfigError(f"drill_job={drill_job!r} is the production job's "
                          "name; a drill needs its own")


def drill_conf(settings: Mapping[str, str], *, drill_job: str, work: str | None) -> dict[str, str]:
    """A submit's ``spark.sparkpoint.*`` `settings` as the drill's: its own job name, a
    restore of another job's snapshot allowed, and its own live location `work` (never the
    production job's: its ``g<N>`` directories would collide)."""
    conf = dict(settings)
    conf[f"{PREFIX}job"] = drill_job
    conf[f"{PREFIX}restore.allowForeignJob"] = "true"
    if work is not None:
        conf[f"{PREFIX}workDir"] = work
    return conf


@dataclass(frozen=True)
class DrillOutcome:
    """What a drill found: the drilled `snapshot` (None: not resolved), the `checks`, the
    run's `result`, the `error` (None: passed), when it started (`verified_at`) and how
    long it took."""

    snapshot: str | None
    checks: dict[str, Any]
    result: dict[str, Any] | None
    error: str | None
    verified_at: float
    duration_s: float
    drill_job: str = ""

    def summary(self) -> dict[str, Any]:
        """The drill operator's XCom: ``ok``, ``snapshot``, ``batch_id``, ``verified_at``,
        ``drill_job``, ``result``."""
        return {"ok": self.error is None, "snapshot": self.snapshot,
                "batch_id": self.checks.get("snapshot_batch"), "verified_at": self.verified_at,
                "drill_job": self.drill_job, "result": self.result}


def run_drill(catalog: Catalog, snapshot: str, *, drill_job: str, storage_options: Mapping[str, Any],
              scrub: Callable[[str], str], verified_by: str,
              drill: Callable[[SnapshotHandle], tuple[dict[str, Any], dict[str, Any] | None]],
              ) -> DrillOutcome:
    """The drill of the snapshot `snapshot` names (`resolve_drilled`): `drill` runs the
    application from it (the checks and the run result; `DrillFailed`, a `SparkpointError`
    or an `OSError` is the drill's failure), and the outcome is recorded beside the
    snapshot (`record_drill`, when it was resolved). Never raises those failures: the
    outcome's `error` holds them."""
    started = time.monotonic()
    verified_at = time.time()
    snapshot_uri: str | None = None
    checks: dict[str, Any] = {"drill_job": drill_job}
    error: str | None = None
    result: dict[str, Any] | None = None
    try:
        handle = resolve_drilled(catalog, snapshot, storage_options=storage_options, scrub=scrub,
                                 drill_job=drill_job)
        snapshot_uri = handle.uri
        checks["snapshot_batch"] = handle.metadata.batch_id
        drilled, result = drill(handle)
        checks.update(drilled)
    except (DrillFailed, SparkpointError, OSError) as exc:
        error = f"restore drill of {snapshot_uri or snapshot!r} failed: {exc}"
    duration = time.monotonic() - started
    if snapshot_uri is not None:
        record_drill(snapshot_uri, verified_at=verified_at, duration_s=round(duration, 3), checks=checks,
                     error=error, verified_by=verified_by, storage_options=storage_options)
    return DrillOutcome(snapshot_uri, checks, result, error, verified_at, duration, drill_job)


def resolve_drilled(catalog: Catalog, snapshot: str, *, storage_options: Mapping[str, Any],
                    scrub: Callable[[str], str], drill_job: str) -> SnapshotHandle:
    """The snapshot `snapshot` names: ``latest`` (what ``restore=latest`` would use),
    `LATEST_SAVEPOINT`, or a URI, path or key under the job root. A named snapshot that
    cannot be opened gets its failed drill recorded (when its ``_metadata`` is there).

    :raises DrillFailed: it cannot be resolved or opened (the message `scrub`bed), or the
        job has no complete savepoint.
    """
    from airflow_sparkpoint.runtime.state_inspect import resolve_snapshot

    target = str(snapshot).strip()
    if target == LATEST_SAVEPOINT:
        target = newest_savepoint(catalog, storage_options=storage_options)
    try:
        return resolve_snapshot(target, catalog=catalog, storage_options=dict(storage_options))
    except (RestoreError, CorruptMetadata) as exc:
        message = scrub(str(exc))
        _record_unresolvable(catalog, target, message, storage_options=storage_options, drill_job=drill_job)
        raise DrillFailed(message) from exc


def newest_savepoint(catalog: Catalog, *, storage_options: Mapping[str, Any]) -> str:
    """The URI of the newest complete savepoint (it has ``_metadata``), valid or not: the
    drill is there to find out whether the savepoint a user would restore restores.

    :raises DrillFailed: the job has no complete savepoint.
    """
    from airflow_sparkpoint.runtime.verify import load_snapshot

    newest: tuple[float, int, str] | None = None
    for entry in catalog.list_savepoints():
        try:
            created = load_snapshot(entry.uri, storage_options=dict(storage_options)).metadata.created_at
        except RestoreError:
            continue  # no _metadata: in progress or abandoned, not a savepoint
        except CorruptMetadata:
            created = 0.0
        if newest is None or (created, entry.id) > newest[:2]:
            newest = (created, entry.id, entry.uri)
    if newest is None:
        raise DrillFailed(f"job {catalog.job!r} has no savepoint under {catalog.uri} (see `sparkpoint list`)")
    return newest[2]


def _record_unresolvable(catalog: Catalog, target: str, error: str, *, storage_options: Mapping[str, Any],
                         drill_job: str) -> None:
    """A named snapshot that cannot even be opened (a file missing or cut short) still
    gets its failed drill recorded, when its ``_metadata`` is there to record beside."""
    if target == "latest":
        return
    uri = target if "://" in target or target.startswith("/") else f"{catalog.uri}/{target.strip('/')}"
    try:
        if open_storage(uri, **storage_options).exists("_metadata"):
            record_drill(uri, verified_at=time.time(), duration_s=0.0, checks={"drill_job": drill_job},
                         error=f"restore drill of {uri} failed: {error}", verified_by="",
                         storage_options=storage_options)
    except SparkpointError as exc:
        log.warning("could not record the failed drill of %s: %s", uri, exc)


def record_drill(snapshot_uri: str, *, verified_at: float, duration_s: float, checks: dict[str, Any],
                 error: str | None, verified_by: str, storage_options: Mapping[str, Any]) -> None:
    """Record the drill's outcome next to `snapshot_uri` (level ``drill``); a storage
    error is logged, never raised (the drill's own outcome stands)."""
    from airflow_sparkpoint.runtime.verify import record_verification

    record = VerificationRecord(verified_at=verified_at, level="drill", duration_s=duration_s, checks=checks,
                                error=error, verified_by=verified_by)
    try:
        record_verification(snapshot_uri, record, storage_options=dict(storage_options))
    except StorageError as exc:
        log.warning("could not record the drill of %s next to it: %s", snapshot_uri, exc)


@dataclass
class Scratch:
    """A drill's own directory (`root`, under `drill_dir` or a temporary `base`) and
    Spark's live location of it (`work`: under the executors' `work_dir` when set, else
    ``<root>/live``; None for an ``s3://`` root without a `work_dir`, which the runtime
    refuses by name)."""

    root: str
    base: str | None
    work: str | None

    @classmethod
    def create(cls, drill_dir: str | None, work_dir: str | None) -> Scratch:
        """A fresh drill directory (made when local)."""
        drill_id = f"drill-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        base, made = drill_dir, None
        if not base:
            base = made = tempfile.mkdtemp(prefix="sparkpoint-drills-")
        root = f"{str(base).rstrip('/')}/{drill_id}"
        if split_uri(root)[0] == "file":
            os.makedirs(_local(root), exist_ok=True)
        if work_dir:  # the location every executor sees (a worker's tmp would be refused)
            work: str | None = f"{str(work_dir).rstrip('/')}/sparkpoint-drills/{drill_id}"
        elif split_uri(root)[0] == "file":
            work = f"{_local(root)}/live"
        else:
            work = None
        return cls(root, made, work)

    def remove(self, *, storage_options: Mapping[str, Any], work_dir: str | None) -> None:
        """Delete the drill's directory, its live location under `work_dir` and the
        temporary base; failures are logged."""
        root = self.root
        try:
            if split_uri(root)[0] == "file":
                shutil.rmtree(_local(root), ignore_errors=True)
            else:
                open_storage(root, **storage_options).delete_prefix("")
        except (SparkpointError, OSError) as exc:
            log.warning("could not remove the drill's scratch directory %s: %s", root, exc)
        if self.work is not None and work_dir:
            shutil.rmtree(_local(self.work), ignore_errors=True)
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)
            self.base = None


def drill_arguments(application_args: Sequence[Any] | None, output_args: Mapping[str, str],
                    root: str) -> list[str]:
    """`application_args` with every output argument of `output_args` pointed at the
    scratch directory `root` (`SCRATCH` in a value stands for it).

    :raises ConfigError: an output argument is not among the application's arguments,
        or has no value to replace.
    """
    args = [str(a) for a in (application_args or [])]
    for name, value in output_args.items():
        flag = name if name.startswith("-") else f"--{name}"
        positions = [i for i, a in enumerate(args) if a == flag]
        inline = [i for i, a in enumerate(args) if a.startswith(flag + "=")]
        replacement = str(value).replace(SCRATCH, root)
        if not positions and not inline:
            raise ConfigError(f"output_args names {flag!r}, which is not among "
                              f"application_args {args}; a drill "
                              "must replace every argument through which the application writes")
        for i in positions:
            if i + 1 >= len(args):
                raise ConfigError(f"application argument {flag!r} has no value to replace")
            args[i + 1] = replacement
        for i in inline:
            args[i] = f"{flag}={replacement}"
    return args


def check_result(result: dict[str, Any] | None, handle: SnapshotHandle) -> dict[str, Any]:
    """The checks of a drill's run result: it finished, restored `handle`, and its first
    batch is right after the snapshot's (after the repartitioner's batch when rescaled).

    :raises DrillFailed: the run did not finish from `handle` after its batch.
    """
    if result is None:
        raise DrillFailed("the application ended without a Sparkpoint run result "
                          "(did it call job.run()?)")
    batch = handle.metadata.batch_id
    checks = {key: result.get(key) for key in ("status", "restore_mode", "first_batch", "last_batch",
                                               "batches_processed", "generation")}
    if result.get("status") != "finished":
        raise DrillFailed(f"the run ended {result.get('status')!r}, expected 'finished' (availableNow)")
    if result.get("restore_mode") != "snapshot" or result.get("restored_from") != handle.uri:
        raise DrillFailed(f"the run restored {result.get('restored_from')!r} "
                          f"({result.get('restore_mode')}), "
                          f"not the snapshot {handle.uri}")
    first, last = result.get("first_batch"), result.get("last_batch")
    rescaled = result.get("rescaled") or {}
    expected = batch + 1
    if rescaled:
        # state_partitions: Spark's repartitioner committed batch+1 without input (it
        # never reaches the sinks), so the first batch the run processed is batch+2.
        checks["rescaled"] = rescaled
        if rescaled.get("batch") == batch + 1:
            expected = batch + 2
    if first is not None and first != expected:
        after = ("right after the repartitioner's batch" if expected == batch + 2
                 else "right after the snapshot")
        raise DrillFailed(f"the run's first batch was {first}, expected {expected} ({after})")
    if last is not None and last < batch:
        raise DrillFailed(f"the run's last batch {last} is before the snapshot's batch {batch}")
    return checks


def _local(uri: str) -> str:
    return re.sub(r"^file://", "", uri)
