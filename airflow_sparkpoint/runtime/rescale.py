"""Rescale on restore: ``spark.sparkpoint.restore.statePartitions=N`` restores a snapshot
into N state partitions (Flink's restore with a new parallelism).

How, in the order the runtime does it:

1. `plan_rescale` (read-only, before the generation is claimed and again after it): the
   snapshot's partition count is the ``spark.sql.shuffle.partitions`` Spark recorded in
   its offset log for the snapshot's batch (Spark takes it from there on every restart,
   whatever the session says); its stateful operators come from Spark's operator
   metadata (``state/<op>/_metadata``). An operator Spark's repartitioner cannot handle
   is refused here, by name, before anything is written; so is state kept by another
   provider than RocksDB (the repartitioner refuses HDFS-backed state).
2. The run materializes a fresh private live location (never in place) from the
   snapshot, which itself is never touched (NO_CLAIM), then `rescale_live` runs Spark's
   offline repartitioner on that copy, fenced by the generation. Spark rewrites the
   state of the last batch N into N partitions and commits a synthetic batch N+1 with
   the offsets of N (no input) and ``spark.sql.shuffle.partitions=N`` in its offset log
   entry, which the restarted query then uses.
3. The synthetic batch never reaches ``foreachBatch``: the query resumes with batch
   N+2. Batch ids stay Spark's (the sinks' transaction keys just skip N+1, nothing is
   renumbered), and the runtime checkpoints batch N+1 at once, so the new partition
   count is recorded in the next checkpoint, ``restore=latest`` resumes from the
   rescaled state, and sink-position checks compare Spark batch ids as always.

Spark's repartitioner leaves two things stale that this module corrects in the private
copy, after the repartition has committed: the unversioned (v1) operator metadata keeps
the old partition count (``inspect`` and ``verify`` read it), and scaling down leaves the
directories of the dropped partitions behind (checkpoints would carry them and count them).

A repartition killed halfway leaves an offset log entry N+1 whose partition count
differs from N's and no commit: such a location is never resumed in place
(`interrupted`); the retry materializes the snapshot again.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import layout, spark_layout
from airflow_sparkpoint.exceptions import (
    ConfigError,
    InvalidPath,
    RestoreError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.storage.localfs import Dir

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from airflow_sparkpoint.checkpoints import SnapshotHandle
    from airflow_sparkpoint.runtime.restore_plan import RestorePlan

__all__ = ["KEY", "PROVIDER", "SHUFFLE_PARTITIONS", "SUPPORTED_OPERATORS", "RescalePlan",
           "apply_shuffle_partitions", "check_shuffle_partitions", "interrupted", "offset_log_conf",
           "plan_rescale", "rescale_live", "summary"]

log = logging.getLogger(__name__)

KEY = "spark.sparkpoint.restore.statePartitions"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PROVIDER = "spark.sql.streaming.stateStore.providerClass"

#: operator names (``state-metadata``'s operatorName) Spark 4.2's offline repartitioner
#: handles (``StatePartitionKeyExtractorFactory``); anything else fails inside Spark
#: after it has already written its offset log entry.
SUPPORTED_OPERATORS = frozenset({
    "stateStoreSave",                   # aggregations
    "dedupe",                           # dropDuplicates
    "dedupeWithinWatermark",            # dropDuplicatesWithinWatermark
    "sessionWindowStateStoreSaveExec",  # session windows
    "symmetricHashJoin",                # stream-stream joins
    "flatMapGroupsWithState",
    "applyInPandasWithState",
    "transformWithStateExec",
    "transformWithStateInPandasExec",
    "transformWithStateInPySparkExec",
})


@dataclass(frozen=True)
class RescalePlan:
    """What ``restore.statePartitions`` asks of this restore."""

    target: int
    current: int | None = None  # the snapshot's state partitions; None: empty state
    batch_id: int | None = None  # the snapshot's batch
    operators: tuple[tuple[int, str], ...] = ()  # (id, Spark operator name)

    @property
    def needed(self) -> bool:
        """Whether Spark's repartitioner must run (a stateful snapshot with another count)."""
        return self.current is not None and bool(self.operators) and self.current != self.target

    def describe(self) -> str:
        if self.current is None:
            return f"empty state starts with {self.target} state partitions"
        if not self.operators:
            return f"the snapshot has no stateful operator: nothing to rescale to {self.target} partitions"
        if not self.needed:
            return f"the snapshot already has {self.target} state partitions: nothing to rescale"
        ops = ", ".join(f"{i} ({n})" for i, n in self.operators)
        return (f"rescale from {self.current} to {self.target} state partitions "
                f"(batch {self.batch_id}; operators {ops})")


def plan_rescale(target: int | None, plan: RestorePlan) -> RescalePlan | None:
    """The rescale `plan` needs for ``statePartitions=target``; only reads the snapshot.

    :raises ConfigError: `target` is not a positive integer.
    :raises RestoreError: an operator of the snapshot cannot be repartitioned (named in
        the message), or the snapshot lacks the offset log entry or operator metadata
        the repartitioner needs.
    """
    if target is None:
        return None
    if isinstance(target, bool) or not isinstance(target, int) or target < 1:
        raise ConfigError(f"{KEY}={target!r} is invalid; expected an integer >= 1")
    if plan.snapshot is None:
        return RescalePlan(target)
    handle = plan.snapshot
    meta = handle.metadata
    conf = _snapshot_conf(handle)
    value = conf.get(SHUFFLE_PARTITIONS)
    if value is None or not value.isdigit():
        raise RestoreError(f"{handle.uri}: offsets/{meta.batch_id} records no {SHUFFLE_PARTITIONS}; "
                           "it cannot be rescaled")
    current = int(value)
    operators = _snapshot_operators(handle)
    provider = conf.get(PROVIDER, "")
    if operators and current != target and not provider.endswith(".RocksDBStateStoreProvider"):
        raise RestoreError(
            f"{KEY}={target}: {handle.uri} keeps its state with "
            f"{provider or 'an unknown state store provider'}; "
            "Spark's offline state repartitioner supports RocksDB state only "
            "(spark.sparkpoint.stateStore=rocksdb, "
            f"the default). Restore it with its own {current} state partitions (remove {KEY})"
        )
    unsupported = [(i, name) for i, name in operators if name not in SUPPORTED_OPERATORS]
    if unsupported and current != target:
        named = ", ".join(f"operator {i} ({name})" for i, name in unsupported)
        raise RestoreError(
            f"{KEY}={target}: {named} of {handle.uri} cannot be repartitioned; Spark's offline state "
            f"repartitioner supports {', '.join(sorted(SUPPORTED_OPERATORS))}. Restore it with its own "
            f"{current} state partitions (remove {KEY}), or start the query with empty state"
        )
    return RescalePlan(target, current, meta.batch_id, tuple(operators))


def _read(handle: SnapshotHandle, path: str) -> bytes | None:
    try:
        return handle.read_log(path)  # bounded: a planted offset log of any size is refused
    except StorageError as exc:
        raise RestoreError(f"{handle.uri}: cannot read {path}: {exc}") from exc


def _snapshot_conf(handle: SnapshotHandle) -> dict[str, str]:
    """The SQL conf Spark recorded in the offset log for the snapshot's batch."""
    batch = handle.metadata.batch_id
    data = _read(handle, spark_layout.offsets_entry(batch))
    if data is None:
        raise RestoreError(f"{handle.uri} has no offset log entry offsets/{batch}; it cannot be rescaled")
    return offset_log_conf(data)


def offset_log_conf(data: bytes) -> dict[str, str]:
    """The SQL conf of an offset log entry (``v1`` line, then the metadata JSON line)."""
    lines = data.decode("utf-8", errors="replace").splitlines()
    try:
        conf = json.loads(lines[1]).get("conf", {}) if len(lines) > 1 else {}
    except ValueError:
        return {}
    return {str(k): str(v) for k, v in conf.items()} if isinstance(conf, dict) else {}


def _snapshot_operators(handle: SnapshotHandle) -> list[tuple[int, str]]:
    """(id, name) of every stateful operator, from Spark's operator metadata at the
    snapshot's batch (v2: the newest version <= the batch; v1 otherwise)."""
    batch = handle.metadata.batch_id
    chosen: dict[int, tuple[int, str]] = {}  # op -> (v2 batch or -1 for v1, path)
    state_ops: set[int] = set()
    for ref in handle.metadata.files:
        in_state = spark_layout.state_partition(ref.path)
        if in_state is not None:
            state_ops.add(in_state[0])
        metadata = spark_layout.operator_metadata(ref.path)
        if metadata is None or not metadata[0].isdigit():
            continue
        op, version = int(metadata[0]), -1 if metadata[1] is None else metadata[1]
        if version > batch:
            continue
        if op not in chosen or version > chosen[op][0]:
            chosen[op] = (version, ref.path)
    operators = []
    for op in sorted(state_ops):
        if op not in chosen:
            raise RestoreError(f"{handle.uri}: stateful operator {op} has no operator metadata "
                               f"(state/{op}/_metadata, written by Spark 3.5 and "
                               "later); it cannot be rescaled")
        data = _read(handle, chosen[op][1]) or b""
        operators.append((op, _operator_name(data) or f"unknown operator {op}"))
    return operators


def _operator_name(data: bytes) -> str | None:
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.startswith("{"):
            try:
                info = json.loads(line).get("operatorInfo", {})
            except ValueError:
                return None
            return str(info.get("operatorName")) if info.get("operatorName") else None
    return None


# ------------------------------------------------------------------------ shuffle partitions


def check_shuffle_partitions(conf: dict[str, str], rescale: RescalePlan | None) -> None:
    """Refuse an explicit ``spark.sql.shuffle.partitions`` that contradicts the target
    (Spark would use the offset log's value anyway; a different setting only misleads).

    :raises ConfigError: naming both settings.
    """
    if rescale is None:
        return
    given = conf.get(SHUFFLE_PARTITIONS)
    if given is not None and given.strip() != str(rescale.target):
        raise ConfigError(
            f"{SHUFFLE_PARTITIONS}={given} contradicts {KEY}={rescale.target}: state partitions are shuffle "
            f"partitions; remove {SHUFFLE_PARTITIONS} or set it to {rescale.target}"
        )


def apply_shuffle_partitions(spark: SparkSession, rescale: RescalePlan | None) -> None:
    """Set the session's shuffle partitions to the target: what a query starting with
    empty state records in its first offset log entry (a restored query takes the value
    from the offset log, which the repartitioner wrote)."""
    if rescale is not None:
        spark.conf.set(SHUFFLE_PARTITIONS, str(rescale.target))


# ------------------------------------------------------------------------ the repartition


def _repartitioner(spark: SparkSession) -> Any:
    """Spark's offline state repartitioner (private and experimental in PySpark 4.2: the
    one place that names it)."""
    # The RocksDB provider registers with the driver's StateStoreCoordinator, which only
    # exists once the session's StreamingQueryManager does.
    _ = spark.streams
    manager = getattr(spark, "_streamingCheckpointManager", None)
    if manager is None or not hasattr(manager, "repartition"):
        raise SparkpointError(
            f"{KEY} needs Spark's offline state repartitioner (PySpark 4.2 classic: "
            f"SparkSession._streamingCheckpointManager.repartition); this Spark {spark.version} has none"
        )
    return manager


def rescale_live(spark: SparkSession, live: str, rescale: RescalePlan, fence: Callable[[], None]) -> int:
    """Repartition the private live location `live` (at its last committed batch: the
    snapshot's, or the last one replayed) into ``rescale.target`` partitions; return the
    synthetic batch id Spark committed.

    :raises StaleGeneration: (from `fence`) a newer generation took over; nothing was changed.
    :raises SparkpointError: the repartition failed or its result is not what was asked.
    """
    assert rescale.needed and rescale.batch_id is not None
    path = livedir.require_local(live)
    # The snapshot's batch, or a later one when the run replayed what a sink held (runtime.replay).
    batch = livedir.last_commit(path)
    if batch is None or batch < rescale.batch_id or _exists(path, spark_layout.offsets_entry(batch + 1)):
        raise SparkpointError(f"live location {live} is not at a committed batch >= "
                              f"{rescale.batch_id} with nothing "
                              f"after it (last commit {batch}); refusing to rescale it")
    fence()
    log.info("%s: %s in %s", KEY, rescale.describe(), live)
    manager = _repartitioner(spark)
    synthetic = batch + 1
    error: list[BaseException] = []

    def repartition() -> None:
        try:
            manager.repartition(live, rescale.target, enforce_exactly_once_sink=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)

    worker = threading.Thread(target=repartition, name="sparkpoint-rescale", daemon=True)
    worker.start()
    if faults.armed("rescale"):
        # Kill while Spark rewrites the state: its offset log entry of N+1 exists, its commit not yet.
        while worker.is_alive() and not _exists(path, spark_layout.offsets_entry(synthetic)):
            worker.join(0.01)
        faults.maybe_kill("rescale", batch)
    worker.join()
    if error:
        raise SparkpointError(f"{KEY}={rescale.target}: Spark's repartitioner failed on {live}: "
                              f"{_first_line(error[0])}") from error[0]
    if livedir.last_commit(path) != synthetic:
        raise SparkpointError(f"{KEY}={rescale.target}: the repartitioner did not commit "
                              f"batch {synthetic} in {live}")
    try:
        recorded = offset_log_conf(
            (livedir.read_log_file(path, spark_layout.offsets_entry(synthetic)) or "").encode()
        ).get(SHUFFLE_PARTITIONS)
    except (OSError, ValueError) as exc:  # a link, or over the limit of a log file
        raise SparkpointError(f"{KEY}={rescale.target}: cannot read offsets/{synthetic} in {live}: "
                              f"{exc}") from None
    if recorded != str(rescale.target):
        raise SparkpointError(f"{KEY}={rescale.target}: the repartitioner recorded "
                              f"{SHUFFLE_PARTITIONS}={recorded} "
                              f"for batch {synthetic} in {live}")
    fence()
    try:
        with livedir.open_location(path) as location:
            _fix_v1_metadata(location, rescale.target)
            removed = _remove_dropped_partitions(location, rescale.target)
    except (OSError, ValueError) as exc:  # a link planted in the location, metadata over its limit
        raise SparkpointError(f"{KEY}={rescale.target}: cannot update the state "
                              f"metadata in {live}: {exc}") from None
    log.info("%s: state of batch %d repartitioned from %d to %d partitions as batch %d%s", KEY, batch,
             rescale.current, rescale.target, synthetic,
             f" ({removed} dropped partition directories removed)" if removed else "")
    return synthetic


def summary(rescale: RescalePlan | None, synthetic: int | None) -> dict[str, Any]:
    """The run result's ``rescaled`` field: empty unless the repartitioner ran."""
    if rescale is None or synthetic is None:
        return {}
    return {"from": rescale.current, "to": rescale.target, "batch": synthetic}


def _first_line(exc: BaseException) -> str:
    """The message of Spark's own exception (a Py4J error's first line names only the call)."""
    java = getattr(exc, "java_exception", None)
    text = ""
    if java is not None:
        try:
            text = str(java.toString())
        except Exception:  # noqa: BLE001 - the JVM may be gone; fall back to the Python text
            text = ""
    text = (text or str(exc)).strip() or type(exc).__name__
    return text.splitlines()[0]


def _exists(path: str, rel: str) -> bool:
    try:
        with livedir.open_location(path) as location:
            return location.stat(rel) is not None
    except (FileNotFoundError, InvalidPath):
        return False


def _fix_v1_metadata(location: Dir, partitions: int) -> None:
    """Spark's unversioned operator metadata (``state/<op>/_metadata/metadata``, v1) keeps
    the old partition count; ``state-metadata`` reports it. Rewrite it (a new file
    renamed over the old one: a hard-linked original is never changed)."""
    for op in location.subdirs(spark_layout.STATE):
        target = spark_layout.operator_metadata_v1(op)
        if not location.is_file(target):
            continue
        lines = location.read(target, layout.SNAPSHOT_LOG_MAX_BYTES).decode("utf-8").splitlines()
        if len(lines) < 2 or lines[0].strip() != "v1":
            continue
        body = json.loads(lines[1])
        stores = body.get("stateStoreInfo", [])
        if all(s.get("numPartitions") == partitions for s in stores):
            continue
        for store in stores:
            store["numPartitions"] = partitions
        location.write(target, ("v1\n" + json.dumps(body, separators=(",", ":"))).encode(), fsync=False)
        directory, _, name = target.rpartition("/")
        # Hadoop would check the old checksum against the new bytes
        location.unlink(f"{directory}/.{name}.crc")


def _remove_dropped_partitions(location: Dir, partitions: int) -> int:
    """Scaling down: delete ``state/<op>/<p>`` for p >= `partitions` (Spark reads only the
    new ones; the old state stays in the snapshot the run restored)."""
    removed = 0
    for op in location.subdirs(spark_layout.STATE):
        if not op.isdigit():
            continue
        for name in location.subdirs(f"{spark_layout.STATE}/{op}"):
            if spark_layout.is_partition_dir(name) and int(name) >= partitions:
                location.remove_tree(f"{spark_layout.STATE}/{op}/{name}")
                removed += 1
    return removed


def interrupted(path: str, batch: int) -> bool:
    """Whether the live location at `path` holds a repartition of batch `batch` that did
    not complete (offset log entry N+1 with another partition count, no commit N+1): it
    must not be resumed in place, whatever is restored. An offsets entry that cannot be
    read (a link, over the limit of a log file) counts as one: never resumed in place."""
    try:
        before_text = livedir.read_log_file(path, spark_layout.offsets_entry(batch))
        after_text = livedir.read_log_file(path, spark_layout.offsets_entry(batch + 1))
    except (OSError, ValueError) as exc:
        log.warning("live location %s is not resumed in place: %s", path, exc)
        return True
    if before_text is None or after_text is None:
        return False
    before = offset_log_conf(before_text.encode()).get(SHUFFLE_PARTITIONS)
    after = offset_log_conf(after_text.encode()).get(SHUFFLE_PARTITIONS)
    return before != after and not _exists(path, spark_layout.commits_entry(batch + 1))
