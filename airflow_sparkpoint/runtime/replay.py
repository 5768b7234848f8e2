"""The self-healing fallback: replay the batches a sink already holds (#15).

When the newest checkpoints are damaged or lost after their batches were committed, the
restart point (the newest valid checkpoint, batch C) is behind the sink (batch K).
Every commit carries a *replay record* of its batch (`capture`, taken from Spark's live
checkpoint while the batch is staged, kept by the sink beside its transaction key):

* ``offsets``: the batch's offset log entry ``offsets/N``, verbatim;
* ``prev``: the sha256 of ``offsets/N-1`` (None for batch 0): the records chain;
* ``sources``: for file sources (offset ``{"logOffset": n}``, the sources that keep a log
  of their own) the entries ``sources/<i>/<k>`` the batch covers.

A restart with ``restore=latest`` and ``restore.sinkAhead=fail`` replays instead of
refusing when `plan_replay` proves it exact: every batch C+1..K has a record in the
commit in effect, the chain starts at the restart point's own ``offsets/C`` and is
unbroken, and each source can be read again with those offsets (file sources from their
recorded log; structured offsets such as Kafka's or a Python data source's by range, as
Spark's own recovery of an unfinished batch does). Counter offsets (rate, socket and
memory sources) are refused: their input is not kept. Otherwise the restart is refused
as before, and the error says why.

`replay_committed` runs after the claim and after recovery, fenced by the generation:
for each batch it writes the recorded entries into the run's own live location and lets
Spark execute just that batch (``Trigger.Once`` on an offset log whose last entry has
no commit: Spark re-runs it with these offsets), consuming its rows without writing them
(the sink holds that batch already); state is rebuilt from the same input. The run then
goes on with new input.

The record is opaque text to the sinks: ``1:`` + base64(zlib(JSON)), or ``0:<reason>``
when the batch cannot be recorded (the reason is what the refusal quotes).

The live location is a shared place (the work directory's writers): it is read and
written through `storage.localfs` (no link followed: an ``offsets`` or ``sources``
directory planted as a link is refused), log files whole only up to
`layout.SNAPSHOT_LOG_MAX_BYTES`, file source logs line by line.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint import faults
from airflow_sparkpoint.checkpoints import SnapshotHandle, bounded, layout, spark_layout
from airflow_sparkpoint.checkpoints.bounded import Limits
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.exceptions import InvalidPath, SinkAheadError, SparkpointError
from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.livedir import file_source_log_offset as _log_offset
from airflow_sparkpoint.runtime.livedir import source_offsets
from airflow_sparkpoint.sinks.base import Sink
from airflow_sparkpoint.storage.localfs import Dir
from airflow_sparkpoint.storage.paths import confine

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

__all__ = ["BODY_MAX_BYTES", "BODY_MAX_COST", "RECORD_MAX_CHARS", "SCHEMA_VERSION", "ReplayPlan", "capture",
           "counter_source", "decode", "plan_replay", "replay_committed", "run_batch", "sha",
           "snapshot_offsets", "sources_replayable", "write_batch"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
#: a record larger than this (encoded) is not kept: the batch is then not replayable
RECORD_MAX_CHARS = 256 * 1024
#: a record's JSON is never decompressed past this (a record is read from a sink: a
#: shared place, whose writer could plant a decompression bomb)
BODY_MAX_BYTES = 16 * 1024 * 1024
#: nor parsed to more memory than this (`checkpoints.bounded`)
BODY_MAX_COST = 64 * 1024 * 1024
#: the end of a compact file read first for a compaction batch's entries (grown until they
#: are all in it, up to `BODY_MAX_BYTES`: more would not fit in a record): a batch's
#: entries are a few lines
_TAIL_WINDOW = 64 * 1024


# ---------------------------------------------------------------------------- capture


def capture(live_root: str, batch_id: int, code_version: str | None = None) -> str:
    """The replay record of batch `batch_id`, read from the live checkpoint at
    `live_root` (Spark wrote ``offsets/N`` and the source log entries before running the
    batch), with the job's `code_version` when it declares one. Never raises: a batch
    that cannot be recorded gets ``0:<reason>``."""
    try:
        with livedir.open_location(live_root) as root:
            body = _capture(root, batch_id)
    except (OSError, ValueError) as exc:  # ObjectTooLarge and InvalidPath are ValueErrors
        return f"0:its offsets could not be read from the live checkpoint ({exc})"
    if isinstance(body, str):
        return "0:" + body
    if code_version is not None:
        body["code"] = code_version
    data = "1:" + base64.b64encode(zlib.compress(json.dumps(body, separators=(",", ":")).encode(),
                                                 9)).decode()
    if len(data) > RECORD_MAX_CHARS:
        return f"0:its replay record ({len(data)} characters) was larger than {RECORD_MAX_CHARS}"
    return data


def _capture(root: Dir, batch: int) -> dict[str, Any] | str:
    offsets = _read_text(root, spark_layout.offsets_entry(batch))
    if offsets is None:
        return f"offsets/{batch} was not in the live checkpoint"
    prev: str | None = None
    if batch > 0:
        prev = _read_text(root, spark_layout.offsets_entry(batch - 1))
        if prev is None:
            return f"offsets/{batch - 1} was not in the live checkpoint"
    before = source_offsets(prev) if prev is not None else []
    sources: dict[str, Any] = {}
    for index, line in enumerate(source_offsets(offsets)):
        end = _log_offset(line)
        if end is None:
            continue
        start = _log_offset(before[index]) if index < len(before) else None
        entries: dict[str, list[str]] = {}
        compact: list[int] = []
        for k in range((-1 if start is None else start) + 1, end + 1):
            found = _log_entries(root, f"{spark_layout.SOURCES}/{index}", k)
            if found is None:
                return f"sources/{index}/{k} was not in the live checkpoint"
            entries[str(k)] = found[0]
            if found[1]:
                compact.append(k)
        sources[str(index)] = {"entries": entries, "compact": compact}
    return {"v": SCHEMA_VERSION, "batch": batch, "offsets": offsets,
            "prev": _sha(prev) if prev is not None else None, "sources": sources}


def decode(record: str) -> dict[str, Any] | str:
    """The body of a replay record, or the reason it has none."""
    kind, _, data = record.partition(":")
    if kind == "0":
        return data
    if kind != "1":
        return f"its replay record has an unknown format ({kind[:20]!r})"
    if len(data) > RECORD_MAX_CHARS:
        return f"its replay record is {len(data)} characters, over the limit of {RECORD_MAX_CHARS}"
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(base64.b64decode(data, validate=True), BODY_MAX_BYTES)
        if inflater.unconsumed_tail:
            return f"its replay record decompresses past the limit of {BODY_MAX_BYTES} bytes"
        # CorruptRecord: a ValueError
        body = bounded.decode(raw, Limits(BODY_MAX_BYTES, BODY_MAX_COST), "the record")
    except (binascii.Error, zlib.error, ValueError) as exc:
        return f"its replay record is unreadable ({exc})"
    if (not isinstance(body, dict) or body.get("v") != SCHEMA_VERSION
            or not isinstance(body.get("offsets"), str)):
        return "its replay record has an unknown schema"
    return body


def _log_entries(root: Dir, directory: str, k: int) -> tuple[list[str], bool] | None:
    """The entry lines of batch `k` of the file source log `directory` (relative to the
    live location `root`) and whether `k` is a compaction batch (``k.compact`` holds every
    entry up to k); None when neither file exists."""
    plain = _lines(root, f"{directory}/{k}")
    if plain is not None:
        return plain, False
    path = f"{directory}/{spark_layout.compact_name(k)}"
    try:
        tail = _compacted_tail(root, path, k)
        if tail is not None:
            return tail, True
        return _compacted_lines(root, path, k), True
    except (FileNotFoundError, NotADirectoryError):
        return None


def _compacted_tail(root: Dir, path: str, k: int) -> list[str] | None:
    """The entry lines of batch `k` read backwards from the end of ``k.compact`` up to the
    first entry of an earlier batch: Spark writes a compaction batch's own entries after
    every earlier one, and a job of weeks has millions of lines before them. None when the
    file does not end that way (another writer's order: a later batch's entry among them,
    a line without a batch id); the caller then reads it line by line.

    :raises FileNotFoundError: the file is missing.
    :raises ValueError: the batch's entries are larger than a record can hold.
    """
    handle, _st = root.open_file(path)
    with handle:
        size = handle.seek(0, 2)
        window = _TAIL_WINDOW
        while True:
            start = max(0, size - window)
            handle.seek(start)
            # The first line is cut (or, at the start of the file, the version line).
            lines = handle.read(size - start).split(b"\n")[1:]
            mine = []
            for raw in reversed(lines):
                if not raw.strip():
                    continue
                body = json.loads(raw)
                batch = body.get("batchId") if isinstance(body, dict) else None
                if batch == k and type(batch) is int:
                    mine.append(raw.decode("utf-8"))
                elif type(batch) is int and batch < k:
                    return mine[::-1]
                else:
                    return None
            if start == 0:
                return mine[::-1]
            if window >= BODY_MAX_BYTES:
                raise ValueError(f"the entries of batch {k} at the end of {root.path}/{path} are larger than "
                                 f"{BODY_MAX_BYTES} bytes")
            window *= 4


def _compacted_lines(root: Dir, path: str, k: int) -> list[str]:
    """The entry lines of batch `k` in ``k.compact``, which holds every entry of the
    source up to `k` (a job of some weeks: millions of lines), read line by line: the lines
    that hold ``"batchId":k`` as Spark writes it, each confirmed by parsing (inside a JSON
    string a quote is escaped, so the text occurs nowhere else; a larger id that starts
    with `k` fails the check); when no line holds it, every line is parsed (another
    writer's spacing, or a batch of no file).

    :raises FileNotFoundError: the file is missing.
    """
    needle = f'"batchId":{k}'.encode()
    lines = [line.decode("utf-8") for line in _entries(root, path)
             if needle in line and json.loads(line).get("batchId") == k]
    return lines or [line.decode("utf-8") for line in _entries(root, path)
                     if json.loads(line).get("batchId") == k]


def _entries(root: Dir, path: str) -> Iterator[bytes]:
    """The entry lines of a log file (after its version line), read line by line.

    :raises FileNotFoundError: it is missing.
    :raises ObjectTooLarge: a line is longer than `spark_layout.LOG_LINE_MAX_BYTES`.
    """
    lines = root.lines(path, spark_layout.LOG_LINE_MAX_BYTES)
    next(lines, None)  # the version
    return (line for line in lines if line.strip())


# ---------------------------------------------------------------------------- the proof


@dataclass(frozen=True)
class ReplayPlan:
    """Batches `first`..`last` replay with `records` (one decoded record each, in order)."""

    first: int
    last: int
    records: tuple[Mapping[str, Any], ...]


def plan_replay(snapshot: SnapshotHandle | None, sink: Sink, job: str, position: int,
                code_version: str | None = None) -> ReplayPlan | str:
    """The replay of batches after `snapshot` (empty state: from batch 0) up to the sink's
    `position` by job code `code_version`, or why it cannot be proven exact: every batch
    was committed by the same declared code version (other code would rebuild other state
    than the one its output came from). Only reads."""
    restart = snapshot.metadata.batch_id if snapshot is not None else -1
    where = f"the restart point (batch {restart})" if snapshot is not None else "empty state"
    prev: str | None = None
    if snapshot is not None:
        try:
            text = snapshot_offsets(snapshot)
        except (SparkpointError, UnicodeDecodeError) as exc:  # over the limit of a log file: corrupt
            return f"the offsets of {snapshot.uri} cannot be read ({exc})"
        if text is None:
            return f"{snapshot.uri} holds no offsets/{restart}"
        prev = _sha(text)
    records = []
    for batch in range(restart + 1, position + 1):
        try:
            raw = sink.replay_record(job, batch)
        except SparkpointError as exc:
            return f"the replay record of batch {batch} cannot be read from {sink.sink_id} ({exc})"
        if raw is None:
            return (f"batch {batch} was committed without a replay record (by an "
                    "earlier release, or the sink "
                    "keeps none), so its offsets are unknown")
        body = decode(raw)
        if isinstance(body, str):
            return f"batch {batch} cannot be replayed: {body}"
        if body.get("batch") != batch:
            return f"the replay record of batch {batch} names batch {body.get('batch')}"
        if body.get("code") != code_version:
            return (f"batch {batch} was committed by job code version "
                    f"{body.get('code') or '(none declared)'} and "
                    f"this run is version {code_version or '(none declared)'} "
                    "(spark.sparkpoint.codeVersion): "
                    "replaying it would not rebuild the state its output came from")
        if body.get("prev") != prev:
            return (f"batch {batch} was committed by a run that did not start from "
                    f"{where} (its previous offsets "
                    "differ), so replaying it from here would not reproduce it")
        why = sources_replayable(body, batch, restart)
        if why is not None:
            return why
        prev = _sha(body["offsets"])
        records.append(body)
    return ReplayPlan(restart + 1, position, tuple(records))


def counter_source(offsets: str, batch: int) -> str | None:
    """Why a source of the offset log entry `offsets` (of batch `batch`) cannot be read
    again with those offsets (a counter offset, as the rate, socket and memory sources
    have; an offset that is not JSON), or None when every source can."""
    for index, line in enumerate(source_offsets(offsets)):
        if line.strip() == "-":
            continue  # the source had no offset yet
        try:
            value = json.loads(line)
        except ValueError:
            return f"source {index} of batch {batch} has an offset that is not JSON ({line[:80]!r})"
        if _log_offset(line) is None and not isinstance(value, (dict, list)):
            return (f"source {index} of batch {batch} has a counter offset ({line[:40]}), "
                    "as the rate, socket and "
                    "memory sources do: its input is not kept, so the batch cannot be read again identically")
    return None


def sources_replayable(body: Mapping[str, Any], batch: int, restart: int) -> str | None:
    """Why batch `batch` of a decoded replay record `body` cannot be read again after the
    restart point `restart` (-1: empty state), or None when it can."""
    why = counter_source(body["offsets"], batch)
    if why is not None:
        return why
    recorded = body.get("sources") or {}
    for index, line in enumerate(source_offsets(body["offsets"])):
        if line.strip() == "-":
            continue
        if _log_offset(line) is not None:
            if str(index) not in recorded:
                return f"the log entries of file source {index} of batch {batch} were not recorded"
        elif restart < 0:
            return (f"source {index} of batch {batch} is not a file source; replaying "
                    "it from empty state would "
                    "need its own log, which is not recorded")
    return None


def snapshot_offsets(snapshot: SnapshotHandle) -> str | None:
    """The text of the snapshot's ``offsets/<its batch>``, or None if it holds none."""
    data = snapshot.read_log(spark_layout.offsets_entry(snapshot.metadata.batch_id))  # bounded
    return None if data is None else data.decode()


# ---------------------------------------------------------------------------- the replay


def replay_committed(
    spark: SparkSession,
    df: DataFrame,
    output_mode: str,
    *,
    sink: Sink,
    fence: Fence,
    snapshot: SnapshotHandle | None,
    live_root: str,
    job: str,
    code_version: str | None = None,
) -> list[int]:
    """Replay, in `live_root`, the batches `sink` holds past `snapshot` with job code
    `code_version`; return their ids. Each batch is fenced by the run's generation
    (`fence`) before it is written.

    :raises SinkAheadError: the sink is ahead and the replay cannot be proven exact.
    :raises StaleGeneration: the fence's generation was superseded; nothing more is written.
    :raises SparkpointError: Spark did not run exactly the replayed batch.
    """
    position = sink.committed_position(job)
    restart = snapshot.metadata.batch_id if snapshot is not None else -1
    if position is None or position <= restart:
        return []
    found = plan_replay(snapshot, sink, job, position, code_version)
    if isinstance(found, str):
        raise SinkAheadError(f"sink {sink.sink_id} has already committed batch {position} "
                             f"of job {job!r}, past the "
                             f"restore point; the batches cannot be replayed: {found}")
    log.warning("sink %s holds batches %d..%d of job %s past the restart point: replaying "
                "batches %d..%d with the "
                "offsets their commits recorded (their output is not written again)", sink.sink_id,
                found.first, found.last, job, found.first, found.last)
    for body in found.records:
        batch = int(body["batch"])
        fence.check()
        faults.pause("replay", batch, generation=fence.generation)
        write_batch(live_root, body)
        run_batch(spark, df, output_mode, live_root, batch)
    return list(range(found.first, found.last + 1))


def write_batch(live_root: str, body: Mapping[str, Any]) -> None:
    """Write batch ``body["batch"]``'s offset log entry and source log entries.

    :raises SparkpointError: the live location (or a directory in it) is a link, or a
        source log to rebuild a compact file from is incomplete; nothing is written
        through a link.
    """
    batch = int(body["batch"])
    try:
        with livedir.open_location(live_root, create=True) as root:
            _write(root, spark_layout.offsets_entry(batch), [body["offsets"].encode()])
            for index, source in (body.get("sources") or {}).items():
                where = confine(f"{spark_layout.SOURCES}/{index}", under=spark_layout.SOURCES,
                                what=f"replay record of batch {batch}: source")
                compact = set(source.get("compact") or ())
                for key, lines in sorted(source["entries"].items(), key=lambda item: int(item[0])):
                    k = int(key)
                    if k in compact:
                        everything = ["v1", *_entries_upto(root, where, k - 1), *lines]
                        _write(root, f"{where}/{spark_layout.compact_name(k)}", _joined(everything))
                    else:
                        _write(root, f"{where}/{k}", _joined(["v1", *lines]))
    except InvalidPath as exc:
        raise SparkpointError(f"replaying batch {batch} in {live_root} refused: {exc}") from None


def _joined(lines: Any) -> Iterator[bytes]:
    """`lines` (str or bytes) joined by line breaks, as chunks."""
    for index, line in enumerate(lines):
        yield (b"\n" if index else b"") + (line if isinstance(line, bytes) else line.encode())


def _entries_upto(root: Dir, directory: str, upto: int) -> Iterator[bytes]:
    """Every entry of a file source log up to batch `upto` (what a compaction file holds),
    read line by line."""
    if upto < 0:
        return
    entries = (spark_layout.log_entry(n) for n in root.names(directory))
    compacts = [entry[0] for entry in entries if entry is not None and entry[1]]
    base = max((c for c in compacts if c <= upto), default=-1)
    if base >= 0:
        yield from _entries(root, f"{directory}/{spark_layout.compact_name(base)}")
    for k in range(base + 1, upto + 1):
        try:
            yield from _entries(root, f"{directory}/{k}")
        except FileNotFoundError:
            raise SparkpointError("cannot rebuild the compacted file source log in "
                                  f"{root.path}/{directory}: entry "
                                  f"{k} is missing") from None


def run_batch(spark: SparkSession, df: DataFrame, output_mode: str, live_root: str, batch: int,
              stage: Callable[[DataFrame, int], None] | None = None,
              started: Callable[[StreamingQuery], None] | None = None) -> None:
    """Let Spark execute batch `batch` from the offset log (its last entry, no commit),
    consuming the rows without writing them, or handing them to `stage` (a foreachBatch
    function: it must consume every partition); `started` is told the query once it runs
    (so that a stop can reach it).

    :raises SparkpointError: Spark ran another batch, or did not commit this one.
    """
    seen: list[int] = []

    def consume(frame: DataFrame, batch_id: int) -> None:
        seen.append(int(batch_id))
        if stage is not None:
            stage(frame, batch_id)
        else:
            frame.write.format("noop").mode("overwrite").save()  # every partition: state is committed

    query = (df.writeStream.outputMode(output_mode).foreachBatch(consume)
             .option("checkpointLocation", live_root).trigger(once=True).start())
    if started is not None:
        started(query)
    query.awaitTermination()
    if seen != [batch] or livedir.last_commit(live_root) != batch:
        raise SparkpointError(f"replaying batch {batch} in {live_root}: Spark ran "
                              f"batches {seen} and its last "
                              f"commit is {livedir.last_commit(live_root)}; expected batch {batch} alone")
    log.info("replayed batch %d in %s", batch, live_root)


# ---------------------------------------------------------------------------- files


def _read_text(root: Dir, path: str) -> str | None:
    """A log file of the live location (bounded), or None when it is missing."""
    return root.read_text(path, layout.SNAPSHOT_LOG_MAX_BYTES)


def _lines(root: Dir, path: str) -> list[str] | None:
    """The entry lines of a plain source log entry, or None when it is missing."""
    try:
        return [line.decode("utf-8") for line in _entries(root, path)]
    except (FileNotFoundError, NotADirectoryError):
        return None


def _write(root: Dir, path: str, chunks: Any) -> None:
    """Write a Spark log file (atomically, streamed), unless it already holds those bytes;
    a stale Hadoop checksum beside it would fail Spark's read, so it goes."""
    directory, _, name = path.rpartition("/")
    crc = f"{directory}/.{name}.crc"
    if root.write(path, chunks, fsync=False, if_changed=True):
        root.unlink(crc)


def sha(text: str) -> str:
    """The sha256 (hex) of an offset log entry's text: the records' chain (``prev``)."""
    return _sha(text)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
