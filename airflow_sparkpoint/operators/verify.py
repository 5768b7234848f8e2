"""`SparkpointDrillOperator` (earlier name `SparkpointVerifyOperator`, kept working): a
full restore drill of a production snapshot — the application itself runs. (``sparkpoint
verify`` restores a snapshot's state *without* the application: a lighter check.)

Submits the pipeline's own application (a `SparkpointSubmitOperator`: same parameters,
same spark-submit) restored from a snapshot of the production job, under a scratch
identity: its own ``spark.sparkpoint.dir`` (a fresh directory under `drill_dir`) and
``spark.sparkpoint.job`` (`drill_job`), output arguments pointing at scratch locations
(`output_args`), ``restore.allowForeignJob=true`` and ``trigger=availableNow``. It runs
until it has caught up, checks that it finished from that snapshot, and records the
outcome next to the production snapshot (``_verification.json``, level ``drill``:
``sparkpoint list --json`` shows ``verified_at`` / ``verify_error``). A failed drill is
recorded, then raised, so the task fails and its ``on_failure_callback`` notifiers fire.

The drill never claims a generation of the production job and never writes to its
sinks: every output argument the DAG author names is replaced, and the drill's sink
transactions are keyed by the drill's job name.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowException

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.verification import VerificationRecord
from airflow_sparkpoint.exceptions import (
    ConfigError,
    CorruptMetadata,
    RestoreError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
from airflow_sparkpoint.operators.submit import SparkpointSubmitOperator
from airflow_sparkpoint.services.stores import validate_job_name
from airflow_sparkpoint.services.submit import PREFIX
from airflow_sparkpoint.storage import open_storage, split_uri

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.services.sinks import Sink

__all__ = ["LATEST_SAVEPOINT", "SCRATCH", "DrillFailed", "SparkpointDrillOperator",
           "SparkpointVerifyOperator"]

SCRATCH = "{scratch}"
LATEST_SAVEPOINT = "latest_savepoint"
_FIXED = ("restore", "restore_snapshot", "trigger", "commit_mode", "sink", "emit_asset_events")


class SparkpointDrillOperator(SparkpointSubmitOperator):
    """Restore drill: run the application from a production snapshot under a scratch
    identity and record whether it restored (see the module docstring). Returns a summary
    (``ok``, ``snapshot``, ``batch_id``, ``verified_at``, ``drill_job``, ``result``).

    :param job_name: the production pipeline whose snapshot is drilled.
    :param checkpoint_dir: the production storage root; or `sparkpoint_conn_id` (its S3
        settings and credentials serve the drill too).
    :param snapshot: ``latest`` (what ``restore=latest`` would use), ``latest_savepoint``
        (the newest complete savepoint: a damaged one fails the drill rather than being
        skipped), or a snapshot URI, path or key under the job root.
    :param output_args: application arguments to replace, e.g.
        ``{"--output": "{scratch}/alerts"}``: every argument through which the
        application writes. ``{scratch}`` stands for the drill's own directory. Required;
        each must be among `application_args`.
    :param drill_dir: where drills take their fresh directory (a path or ``s3://`` URI;
        default: the worker's temporary directory). On a cluster use storage the
        executors see. Spark's live location of the drill is a fresh directory under
        `work_dir` when it is set (the location every executor sees), else
        ``<its directory>/live`` (an ``s3://`` `drill_dir` then needs `work_dir`): never
        the production job's.
    :param drill_job: the drill's pipeline name (default ``<job_name>-drill``).
    :param keep_scratch: keep the drill's directory afterwards (default: deleted).

    Everything else is passed to `SparkpointSubmitOperator` (``application``,
    ``application_args``, ``conf``, ``conn_id``, ``ship_runtime``, ...), except
    ``restore``, ``trigger`` and ``commit_mode``, which the drill fixes. With
    ``state_partitions`` the drill restores the snapshot rescaled (a rehearsal of a
    rescale); its run then starts one batch later, after the repartitioner's batch.
    """

    template_fields: Sequence[str] = (
        *SparkpointSubmitOperator.template_fields, "snapshot", "output_args", "drill_dir", "drill_job",
    )
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        job_name: str,
        output_args: Mapping[str, str],
        snapshot: str = "latest",
        drill_dir: str | None = None,
        drill_job: str | None = None,
        keep_scratch: bool = False,
        **kwargs: Any,
    ) -> None:
        fixed = sorted(set(_FIXED) & set(kwargs))
        if fixed:
            raise ConfigError(f"{type(self).__name__} sets {', '.join(fixed)} itself (a "
                              "drill restores `snapshot` "
                              "with trigger availableNow, commits in the job and writes "
                              "only scratch output, which "
                              "is no asset); remove the argument")
        if not isinstance(output_args, Mapping) or not output_args:
            raise ConfigError(f"{type(self).__name__} needs output_args: the application "
                              "arguments through which "
                              "it writes, mapped to scratch locations (e.g. {'--output': "
                              "'{scratch}/out'}); without "
                              "them a drill would write to the production sinks")
        kwargs.setdefault("name", f"sparkpoint-drill-{job_name}")
        super().__init__(job_name=job_name, restore="latest", trigger="availableNow",
                         commit_mode="checkpoint", emit_asset_events=False, **kwargs)
        self.output_args = dict(output_args)
        self.snapshot = snapshot
        self.drill_dir = drill_dir
        self.drill_job = drill_job or f"{job_name}-drill"
        self.keep_scratch = keep_scratch
        self._drill_root: str | None = None
        self._drill_base: str | None = None  # a temporary directory this operator made
        self._drill_work: str | None = None  # the drill's own Spark live location
        self._snapshot_uri: str | None = None
        self._production_hook: SparkpointHook | None = None
        self._drill_hook: SparkpointHook | None = None
        self._drill_hook_root: str | None = None

    def declared_output(self) -> Sink | None:
        """A drill writes to scratch locations only: no output asset, no OpenLineage output."""
        return None

    # ------------------------------------------------------------------ identities

    @property
    def production_hook(self) -> SparkpointHook:
        if self._production_hook is None:
            self._production_hook = SparkpointHook(self.sparkpoint_conn_id, storage_uri=self.checkpoint_dir)
        return self._production_hook

    @property
    def sparkpoint_hook(self) -> SparkpointHook:
        """The drill's storage (its scratch root with the production connection's S3
        settings): everything the submit operator derives from it is the drill's."""
        if self._drill_root is None:
            raise ConfigError("the drill's scratch directory is chosen in execute()")
        if self._drill_hook is None or self._drill_hook_root != self._drill_root:
            self._drill_hook = SparkpointHook(self.sparkpoint_conn_id, storage_uri=self._drill_root)
            self._drill_hook_root = self._drill_root
        return self._drill_hook

    def _catalog(self) -> Catalog:
        # The drill's catalog: its generations, results and control channel (on_kill
        # stops the drill, never the production job).
        return self.sparkpoint_hook.get_catalog(self.drill_job)

    def choose_restore(self, try_number: int, catalog: Catalog | None = None,
                       own_generations: Sequence[int] | None = None) -> str:
        """Every try restores the drilled snapshot (into a fresh scratch directory)."""
        if self._snapshot_uri is None:
            raise ConfigError("the drilled snapshot is resolved in execute()")
        return self._snapshot_uri

    def build_sparkpoint_conf(self, restore: str) -> dict[str, str]:
        conf = super().build_sparkpoint_conf(restore)
        conf[f"{PREFIX}job"] = self.drill_job
        conf[f"{PREFIX}restore.allowForeignJob"] = "true"
        if self._drill_work is not None:
            # Never the production job's live location: its g<N> directories would collide.
            conf[f"{PREFIX}workDir"] = self._drill_work
        return conf

    # ------------------------------------------------------------------ execute

    def execute(self, context: Context) -> dict[str, Any]:  # type: ignore[override]
        catalog = self._production_catalog()
        started = time.monotonic()
        verified_at = time.time()
        snapshot_uri: str | None = None
        checks: dict[str, Any] = {"drill_job": self.drill_job}
        error: str | None = None
        result: dict[str, Any] | None = None
        try:
            handle = self._resolve(catalog)
            snapshot_uri = handle.uri
            checks["snapshot_batch"] = handle.metadata.batch_id
            drilled, result = self.drill(context, handle)
            checks.update(drilled)
        except DrillFailed as exc:
            error = f"restore drill of {snapshot_uri or self.snapshot!r} failed: {exc}"
        except (SparkpointError, OSError) as exc:
            error = f"restore drill of {snapshot_uri or self.snapshot!r} failed: {exc}"
        duration = time.monotonic() - started
        if snapshot_uri is not None:
            self._record(snapshot_uri, VerificationRecord(
                verified_at=verified_at, level="drill", duration_s=round(duration, 3), checks=checks,
                error=error, verified_by=f"airflow:{self.dag_id}.{self.task_id}@{socket.gethostname()}"))
        if error is not None:
            raise AirflowException(error)
        self.log.info("restore drill of %s passed in %.1f s: %s", snapshot_uri, duration, checks)
        return {"ok": True, "snapshot": snapshot_uri, "batch_id": checks.get("snapshot_batch"),
                "verified_at": verified_at, "drill_job": self.drill_job, "result": result}

    def _production_catalog(self) -> Catalog:
        validate_job_name(self.drill_job)
        if self.drill_job == self.job_name:
            raise ConfigError(f"drill_job={self.drill_job!r} is the production job's "
                              "name; a drill needs its own")
        return self.production_hook.get_catalog(self.job_name)

    def drill(self, context: Context, handle: SnapshotHandle) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """Run the application from `handle` once, in a fresh scratch directory (removed
        afterwards unless `keep_scratch`); returns the checks and the run result.

        Leaves the operator's own settings as they were, so a caller may drill again.

        :raises DrillFailed: the application failed or did not finish from `handle`
            (the message carries the job's own error when it recorded one).
        """
        saved = (self.application_args, self.conf, self.env_vars, self.py_files)
        self._snapshot_uri = handle.uri
        checks: dict[str, Any] = {"snapshot_batch": handle.metadata.batch_id}
        try:
            self._prepare_scratch()
            self.application_args = self._drill_arguments()
            self.log.info("restore drill of %s (batch %d) as job %s under %s", handle.uri,
                          handle.metadata.batch_id, self.drill_job, self._drill_root)
            try:
                result = super().execute(context)
            except AirflowException as exc:
                raise DrillFailed(f"the application failed: {exc}") from exc
            checks.update(self._check_result(result, handle))
            return checks, result
        finally:
            self._remove_scratch()
            self.application_args, self.conf, self.env_vars, self.py_files = saved
            self.sparkpoint_run = None  # the next drill finds its own run

    def _resolve(self, catalog: Catalog) -> SnapshotHandle:
        from airflow_sparkpoint.runtime.state_inspect import resolve_snapshot

        target = str(self.snapshot).strip()
        if target == LATEST_SAVEPOINT:
            target = self._newest_savepoint(catalog)
        try:
            return resolve_snapshot(target, catalog=catalog,
                                    storage_options=self.production_hook.storage_options)
        except (RestoreError, CorruptMetadata) as exc:
            message = self.production_hook.scrub(str(exc))
            self._record_unresolvable(catalog, target, message)
            raise DrillFailed(message) from exc

    def _newest_savepoint(self, catalog: Catalog) -> str:
        """The newest complete savepoint (it has ``_metadata``), valid or not: the drill
        is there to find out whether the savepoint a user would restore restores.

        :raises DrillFailed: the job has no complete savepoint.
        """
        from airflow_sparkpoint.runtime.verify import load_snapshot

        newest: tuple[float, int, str] | None = None
        options = self.production_hook.storage_options
        for entry in catalog.list_savepoints():
            try:
                created = load_snapshot(entry.uri, storage_options=options).metadata.created_at
            except RestoreError:
                continue  # no _metadata: in progress or abandoned, not a savepoint
            except CorruptMetadata:
                created = 0.0
            if newest is None or (created, entry.id) > newest[:2]:
                newest = (created, entry.id, entry.uri)
        if newest is None:
            raise DrillFailed(f"job {self.job_name!r} has no savepoint under "
                              f"{catalog.uri} (see `sparkpoint list`)")
        return newest[2]

    def _record_unresolvable(self, catalog: Catalog, target: str, error: str) -> None:
        """A named snapshot that cannot even be opened (a file missing or cut short) still
        gets its failed drill recorded, when its ``_metadata`` is there to record beside."""
        if target == "latest":
            return
        uri = target if "://" in target or target.startswith("/") else f"{catalog.uri}/{target.strip('/')}"
        try:
            if open_storage(uri, **self.production_hook.storage_options).exists("_metadata"):
                self._record(uri, VerificationRecord(verified_at=time.time(), level="drill", duration_s=0.0,
                                                     checks={"drill_job": self.drill_job},
                                                     error=f"restore drill of {uri} failed: {error}"))
        except SparkpointError as exc:
            self.log.warning("could not record the failed drill of %s: %s", uri, exc)

    def _record(self, snapshot_uri: str, record: VerificationRecord) -> None:
        from airflow_sparkpoint.runtime.verify import record_verification

        try:
            record_verification(snapshot_uri, record, storage_options=self.production_hook.storage_options)
        except StorageError as exc:
            self.log.warning("could not record the drill of %s next to it: %s", snapshot_uri, exc)

    def _prepare_scratch(self) -> None:
        drill_id = f"drill-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{uuid.uuid4().hex[:8]}"
        base = self.drill_dir
        if not base:
            base = self._drill_base = tempfile.mkdtemp(prefix="sparkpoint-drills-")
        self._drill_root = f"{str(base).rstrip('/')}/{drill_id}"
        if split_uri(self._drill_root)[0] == "file":
            os.makedirs(_local(self._drill_root), exist_ok=True)
        if self.work_dir:  # the location every executor sees (a worker's tmp would be refused)
            self._drill_work = f"{str(self.work_dir).rstrip('/')}/sparkpoint-drills/{drill_id}"
        elif split_uri(self._drill_root)[0] == "file":
            self._drill_work = f"{_local(self._drill_root)}/live"
        else:
            self._drill_work = None  # the runtime refuses an s3:// dir without a workDir, naming it

    def _remove_scratch(self) -> None:
        root = self._drill_root
        if root is None or self.keep_scratch:
            return
        try:
            if split_uri(root)[0] == "file":
                shutil.rmtree(_local(root), ignore_errors=True)
            else:
                open_storage(root, **self.sparkpoint_hook.storage_options).delete_prefix("")
        except (SparkpointError, OSError) as exc:
            self.log.warning("could not remove the drill's scratch directory %s: %s", root, exc)
        if self._drill_work is not None and self.work_dir:
            shutil.rmtree(_local(self._drill_work), ignore_errors=True)
        if self._drill_base is not None:
            shutil.rmtree(self._drill_base, ignore_errors=True)
            self._drill_base = None

    def _drill_arguments(self) -> list[str]:
        """`application_args` with every output argument pointed at the scratch directory.

        :raises ConfigError: an output argument is not among the application's arguments.
        """
        args = [str(a) for a in (self.application_args or [])]
        assert self._drill_root is not None
        for name, value in self.output_args.items():
            flag = name if name.startswith("-") else f"--{name}"
            positions = [i for i, a in enumerate(args) if a == flag]
            inline = [i for i, a in enumerate(args) if a.startswith(flag + "=")]
            replacement = str(value).replace(SCRATCH, self._drill_root)
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

    def _check_result(self, result: dict[str, Any] | None, handle: SnapshotHandle) -> dict[str, Any]:
        """:raises DrillFailed: the run did not finish from `handle` after its batch."""
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


class DrillFailed(Exception):
    """The drill failed; the message says why (internal to the drill operators)."""


def _local(uri: str) -> str:
    return re.sub(r"^file://", "", uri)


class SparkpointVerifyOperator(SparkpointDrillOperator):
    """The earlier name of `SparkpointDrillOperator`: the same operator, kept working.

    It runs the whole application (a drill), which the CLI's ``sparkpoint verify`` does
    not; new DAGs use `SparkpointDrillOperator`, whose name says so.
    """
