"""`RunResult`: how a run of `SparkpointJob.run` ended, and its record
``<job>/results/<generation>.json`` (written by the run, read by the operator's XCom and
the job's read model); `write_run_result` and `read_run_result` are its one store."""

from __future__ import annotations

import bisect
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.exceptions import InvalidPath, RestoreError

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["COMMITTED_BATCHES_LISTED", "ERROR_LINE", "ERROR_MESSAGE_MAX", "RANGES_LISTED", "RESULT_LINE",
           "BatchRanges", "RunResult", "error_line", "parse_error_line", "parse_result_line",
           "read_run_result", "result_key", "result_line", "write_run_result"]

log = logging.getLogger(__name__)


#: how many batch ids a run result lists in ``committed_batches`` (the newest); its
#: ``committed_ranges`` holds all of them, in at most `RANGES_LISTED` ranges
COMMITTED_BATCHES_LISTED = 1000
#: the most ranges (the newest) a stored result keeps in ``committed_ranges``, and batch
#: ids in each list of ``recovered``: a stored result is bounded (`layout.limits_of`)
RANGES_LISTED = 1000


class BatchRanges:
    """A set of batch ids as sorted, disjoint, inclusive ``[first, last]`` ranges.

    What a run keeps of the batches it committed: a job that commits one every few
    seconds for weeks commits hundreds of thousands, nearly always one range (a list of
    their ids grew without bound in the driver, its run result, XCom and asset events)."""

    def __init__(self, ids: Iterable[int] = ()) -> None:
        self._ranges: list[list[int]] = []
        for batch in ids:
            self.add(batch)

    def add(self, batch: int) -> None:
        batch = int(batch)
        ranges = self._ranges
        if ranges and ranges[-1][0] <= batch <= ranges[-1][1] + 1:  # the usual case: the next batch
            ranges[-1][1] = max(ranges[-1][1], batch)
            return
        i = bisect.bisect_right(ranges, batch, key=lambda r: r[0])  # ranges[:i] start at or before it
        if i and ranges[i - 1][1] >= batch:
            return
        ranges.insert(i, [batch, batch])
        if i + 1 < len(ranges) and ranges[i + 1][0] == batch + 1:
            ranges[i][1] = ranges.pop(i + 1)[1]
        if i and ranges[i - 1][1] == batch - 1:
            ranges[i - 1][1] = ranges.pop(i)[1]

    def __len__(self) -> int:
        return sum(last - first + 1 for first, last in self._ranges)

    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple((first, last) for first, last in self._ranges)

    def newest(self, limit: int = COMMITTED_BATCHES_LISTED) -> tuple[int, ...]:
        """The `limit` highest ids, ascending."""
        out: list[int] = []
        for first, last in reversed(self._ranges):
            take = min(limit - len(out), last - first + 1)
            out.extend(range(last, last - take, -1))
            if len(out) >= limit:
                break
        return tuple(reversed(out))


@dataclass(frozen=True)
class RunResult:
    """How a run ended. Returned by `SparkpointJob.run` and pushed to XCom by the operator.

    ``committed_batches``: the batches the run committed, the newest
    `COMMITTED_BATCHES_LISTED` of them when there were more; ``committed_ranges``: all
    of them as ``[first, last]`` ranges."""

    status: str  # "finished" | "stopped"
    job: str
    generation: int
    batches_processed: int = 0
    first_batch: int | None = None
    last_batch: int | None = None
    last_checkpoint_id: int | None = None
    last_checkpoint: str | None = None
    savepoint: str | None = None
    restored_from: str | None = None
    restore_mode: str = ""  # "in-place" | "snapshot" | "empty"
    checkpoints_completed: int = 0
    committed_batches: tuple[int, ...] = ()
    recovered: Mapping[str, Any] = field(default_factory=dict)
    #: Spark's live checkpoint location this run used (never shared with a running generation)
    live_dir: str = ""
    #: how it was prepared: mode ("in-place" | "materialized" | "empty"), files ``linked`` from
    #: the previous location and ``downloaded`` from the snapshot, and the reason
    live_reuse: Mapping[str, Any] = field(default_factory=dict)
    #: ``restore.statePartitions``: ``from`` and ``to`` state partitions and the
    #: repartitioner's synthetic ``batch`` (never staged); empty when nothing was rescaled
    rescaled: Mapping[str, Any] = field(default_factory=dict)
    committed_ranges: tuple[tuple[int, int], ...] = ()

    @classmethod
    def committed(cls, batches: BatchRanges) -> dict[str, Any]:
        """The ``committed_batches`` and ``committed_ranges`` fields of `batches`."""
        return {"committed_batches": batches.newest(), "committed_ranges": batches.ranges()}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["committed_batches"] = list(self.committed_batches)
        data["committed_ranges"] = [list(r) for r in self.committed_ranges]
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunResult:
        """The result `data` (`to_json`'s shape) holds; keys it does not know are ignored.

        :raises TypeError: `status`, `job` or `generation` is missing.
        """
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if "committed_batches" in known:
            known["committed_batches"] = tuple(known["committed_batches"] or ())
        if "committed_ranges" in known:
            known["committed_ranges"] = tuple((int(r[0]), int(r[1])) for r in known["committed_ranges"] or ())
        return cls(**known)


#: how a job script hands its result to the process that started it: one stdout line
RESULT_LINE = "SPARKPOINT_RESULT "


def result_line(result: RunResult) -> str:
    """The stdout line that carries `result` (`parse_result_line` reads it back)."""
    return RESULT_LINE + json.dumps(result.to_json())


def parse_result_line(output: str) -> RunResult | None:
    """The result the last `result_line` in `output` carries, or None when it has none.

    :raises ValueError: that line is not a run result's JSON.
    :raises TypeError: it lacks status, job or generation.
    """
    lines = [line for line in output.splitlines() if line.startswith(RESULT_LINE)]
    return RunResult.from_json(json.loads(lines[-1][len(RESULT_LINE):])) if lines else None


#: how a job script's failure reaches the process that started it: one output line with
#: the error's class and message (the Python traceback above it is for people)
ERROR_LINE = "SPARKPOINT_ERROR "
#: the longest message an error line carries (a failed query's holds Spark's whole trace)
ERROR_MESSAGE_MAX = 4000


def error_line(error: BaseException) -> str:
    """The output line that reports `error` (`parse_error_line` reads it back): its class
    name and message, the message cut at `ERROR_MESSAGE_MAX` characters."""
    message = str(error)
    if len(message) > ERROR_MESSAGE_MAX:
        message = message[:ERROR_MESSAGE_MAX] + " [...]"
    return ERROR_LINE + json.dumps({"type": type(error).__name__, "message": message})


def parse_error_line(line: str) -> tuple[str, str] | None:
    """The (class name, message) an `error_line` carries, or None when `line` is none
    (or is malformed: a line of the driver's output is not trusted to be well formed)."""
    if not line.startswith(ERROR_LINE) or len(line) > 8 * ERROR_MESSAGE_MAX:
        return None
    try:
        data = json.loads(line[len(ERROR_LINE):])
    except ValueError:
        return None
    if (not isinstance(data, dict) or not isinstance(data.get("type"), str)
            or not isinstance(data.get("message"), str)):
        return None
    return data["type"], data["message"]


def result_key(generation: int) -> str:
    return f"{layout.RESULTS}/{generation:012d}.json"


def write_run_result(catalog: Catalog, result: RunResult) -> None:
    """Record how generation `result.generation` ended (replacing an earlier record): its
    ranges and the batch lists of its recovery cut to the newest `RANGES_LISTED`.

    :raises StorageError: the record could not be written.
    :raises CatalogError: it would still be over its limits (`layout.limits_of`).
    """
    recovered = {name: value[-RANGES_LISTED:] if isinstance(value, (list, tuple)) else value
                 for name, value in result.recovered.items()}
    stored = replace(result, committed_ranges=result.committed_ranges[-RANGES_LISTED:], recovered=recovered)
    key = result_key(result.generation)
    body = json.dumps(stored.to_json()).encode()
    bounded.check_writable(body, layout.limits_of(key), f"{catalog.uri}/{key}")
    catalog.store.put(key, body)


def read_run_result(catalog: Catalog, generation: int) -> RunResult | None:
    """The result generation `generation` recorded when it ended, or None when it recorded
    none. A record without its job or generation takes them from the catalog and the key.

    Its ``savepoint`` is read from the store, so it is kept only when it names one of this
    job's savepoints (`Catalog.snapshot_key`, the rule control results follow); any other
    is dropped with a warning: the rest of the record (how the run ended) stays readable
    for the operator's XCom, the history and the CLI, and no caller is handed the path.

    :raises CorruptMetadata: the record is not a JSON object with a ``status``, or is over
        its limits (`CorruptRecord`).
    :raises StorageError: it could not be read.
    """
    key = result_key(generation)

    def parse(raw: dict[str, Any]) -> RunResult:
        return RunResult.from_json({"job": catalog.job, "generation": generation, **raw})

    result = bounded.read_record(catalog.store, key, bounded.json_object(parse), limits=layout.limits_of(key),
                                 where=f"run result {catalog.uri}/{key}")  # CorruptRecord: a CorruptMetadata
    if result is None:
        return None
    if result.savepoint is not None:
        try:
            catalog.snapshot_key(result.savepoint, savepoint_only=True)
        except (InvalidPath, RestoreError) as exc:
            log.warning("run result %s/%s names savepoint %r, not one of job %r's savepoints (%s); ignoring "
                        "that field", catalog.uri, key, result.savepoint, catalog.job, exc)
            result = replace(result, savepoint=None)
    return result
