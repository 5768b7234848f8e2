"""The one bounded reader of records (`checkpoints.bounded`): what a record costs to parse
is bounded before it is parsed, nesting is capped, and every reader of a job's records
goes through it, so a record planted within its byte limit still cannot exhaust a
reader's memory nor crash it with a RecursionError."""

from __future__ import annotations

import json
import logging
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.commit_head import read_commit_head
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.counters import read_counters
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.checkpoints.retention import deleted_since
from airflow_sparkpoint.checkpoints.run_result import read_run_result, result_key
from airflow_sparkpoint.checkpoints.verification import read_verification, verification_key
from airflow_sparkpoint.exceptions import (
    CatalogError,
    ControlError,
    CorruptMetadata,
    CorruptRecord,
    SinkError,
)
from airflow_sparkpoint.sinks import _manifests as manifests

# Shapes that parse to many times their size (an empty dict is 3 bytes of JSON and 72 of
# memory), and keys that are all distinct (the parser's memo keeps each).
SHAPES: dict[str, Callable[[int], bytes]] = {
    "empty objects": lambda n: b"[" + b",".join([b"{}"] * n) + b"]",
    "empty lists": lambda n: b"[" + b",".join([b"[]"] * n) + b"]",
    "short strings": lambda n: b"[" + b",".join(b'"%02d"' % (i % 100) for i in range(n)) + b"]",
    "floats": lambda n: b"[" + b",".join([b"1.5"] * n) + b"]",
    "distinct keys": lambda n: b"{" + b",".join(b'"k%d":1.5' % i for i in range(n)) + b"}",
    "one-key objects": lambda n: b"[" + b",".join([b'{"a":1.5}'] * n) + b"]",
    "non-ascii strings":
        lambda n: ("[" + ",".join(f'"\U0001f600{i % 100}"' for i in range(n)) + "]").encode(),
    # An ASCII document whose escape widens a whole string to 4 (or 2) bytes per character.
    "astral escape": lambda n: b'{"a":"\\ud83d\\ude00' + b"e" * (n * 10) + b'"}',
    "wide escape": lambda n: b'{"a":"\\u0101' + b"e" * (n * 10) + b'"}',
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("count", [1_000, 174_763])  # 174,763 keys: a dict just grown, its table doubled
def test_the_estimate_is_never_below_what_the_parse_takes(shape: str, count: int) -> None:
    data = SHAPES[shape](count)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        json.loads(data)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert bounded.parse_cost(data) >= peak, (shape, count, bounded.parse_cost(data), peak)


def test_a_snapshot_of_many_files_is_estimated_within_a_few_times_its_parse() -> None:
    # What the limits of a _metadata are sized by: its estimate is not absurdly above the truth.
    from tests.support.records import big_job_metadata

    data = big_job_metadata(5_000)
    tracemalloc.start()
    try:
        json.loads(data)
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= bounded.parse_cost(data) <= 4 * peak


LIMITS = bounded.Limits(max_bytes=1 << 20, max_cost=4 << 20, max_depth=8)


def test_over_any_limit_is_corrupt_naming_the_path() -> None:
    where = "s3://b/orders/status.json"
    with pytest.raises(CorruptRecord, match=f"^{where}: .*bytes, over the limit"):
        bounded.decode(b" " * (LIMITS.max_bytes + 1), LIMITS, where)
    with pytest.raises(CorruptRecord, match=f"^{where}: parsing would take about .* KiB"):
        bounded.decode(SHAPES["empty objects"](100_000), LIMITS, where)
    with pytest.raises(CorruptRecord, match=f"^{where}: nested more than 8 levels"):
        bounded.decode(b"[" * 9 + b"]" * 9, LIMITS, where)
    with pytest.raises(CorruptRecord, match=f"^{where}: not valid JSON"):
        bounded.decode(b"{", LIMITS, where)
    with pytest.raises(CorruptRecord, match=f"^{where}: not valid JSON"):
        bounded.decode(b'"\xff"', LIMITS, where)
    assert isinstance(CorruptRecord("x"), ValueError) and isinstance(CorruptRecord("x"), CorruptMetadata)


@pytest.mark.parametrize(("text", "depth"), [
    ('{"a": [1, {"b": []}]}', 4),
    ('["[[[[", "]]]]", {"k": "\\"[[["}]', 2),
    ('["\\\\", [["\\\\\\"]]"]]]', 3),
    ("[" * 8 + "]" * 8, 8),
])
def test_brackets_inside_strings_do_not_count(text: str, depth: int) -> None:
    json.loads(text)
    bounded.decode(text.encode(), bounded.Limits(1 << 20, 1 << 20, max_depth=depth), "r")
    with pytest.raises(CorruptRecord, match="nested"):
        bounded.decode(text.encode(), bounded.Limits(1 << 20, 1 << 20, max_depth=depth - 1), "r")


def test_closing_brackets_in_strings_cannot_hide_depth() -> None:
    deep = "[" * 20 + '"' + "]" * 40 + '"' + "]" * 20
    json.loads(deep)
    with pytest.raises(CorruptRecord, match="nested"):
        bounded.decode(deep.encode(), LIMITS, "r")


def test_writers_refuse_what_readers_would_refuse() -> None:
    with pytest.raises(CatalogError, match="would not be readable.*nested"):
        bounded.check_writable(b"[" * 9 + b"]" * 9, LIMITS, "r", "why")
    bounded.check_writable(b'{"a": 1}', LIMITS, "r")


def test_clip_keeps_both_ends() -> None:
    text = "start " + "x" * 10_000 + " end"
    clipped = bounded.clip(text, 100)
    assert len(clipped) < 200 and clipped.startswith("start") and clipped.endswith("end") and "cut" in clipped
    assert bounded.clip("short", 100) == "short"


# ------------------------------------------------------------------ every reader of a job's records


def _bombs(limit: int) -> dict[str, bytes]:
    """Records within `limit` bytes that a bounded reader must refuse: an object that
    parses to far more memory than its kind allows, and one nested far deeper than any
    record (a RecursionError in Python's parser, and in every walk of what it returns)."""
    count = (limit - 16) // 3
    depth = min(100_000, (limit - 16) // 2)
    return {"costly": b'{"pad":[' + b",".join([b"{}"] * count) + b"]}",
            "deep": b'{"pad":' + b"[" * depth + b"]" * depth + b"}"}


def _readers(catalog: Catalog) -> dict[str, tuple[str, Callable[[], Any]]]:
    """Each reader of a job's records: (the key it reads, a call returning what it read)."""
    def control() -> Any:
        channel = ControlChannel(catalog)
        return channel.read_request("1700000000000-0123abcd")

    def checkpoint() -> Any:
        entry = catalog.checkpoint_entry(4)  # a listing's entry: the reason it is invalid
        if entry.error:
            raise CorruptMetadata(entry.error)
        return entry.metadata

    return {
        "status": (layout.STATUS, lambda: catalog.read_status()),
        "generation status": (layout.status_key(3), lambda: catalog.read_status(3)),
        "counters": (layout.COUNTERS, lambda: read_counters(catalog)),
        "commit head": (layout.COMMITTED, lambda: read_commit_head(catalog)),
        "verification": (verification_key(layout.checkpoint_dir(4)),
                         lambda: read_verification(catalog.store, layout.checkpoint_dir(4))),
        "generation claim": (layout.generation_key(3), lambda: catalog.generation_claim(3)),
        "run result": (result_key(3), lambda: read_run_result(catalog, 3)),
        "origins": (layout.lineage_key(3), lambda: catalog.origins() or None),
        "transactions": (layout.txn_key(2, 3), lambda: catalog.transactions() or None),
        "control request": ("control/1700000000000-0123abcd.request.json", control),
        "deletion journal": (layout.gc_key(1_700_000_000_000, "abcd1234"), lambda: deleted_since(catalog, 0)
                             or None),
        "checkpoint": (layout.checkpoint_metadata(4), checkpoint),
    }


READERS = sorted(_readers(None).keys())  # type: ignore[arg-type]


@pytest.mark.parametrize("bomb", ["costly", "deep"])
@pytest.mark.parametrize("reader", READERS)
def test_every_reader_refuses_a_bomb_within_its_byte_limit(
    catalog: Catalog, reader: str, bomb: str, caplog: pytest.LogCaptureFixture
) -> None:
    key, read = _readers(catalog)[reader]
    limits = layout.limits_of(key)
    data = _bombs(limits.max_bytes)[bomb]
    assert len(data) <= limits.max_bytes  # a bytes cap alone lets it through
    catalog.store.put(key, data)
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # the default: a deep bomb must not depend on a raised limit
    try:
        with caplog.at_level(logging.WARNING):
            try:
                value = read()
            except (CorruptMetadata, ControlError) as exc:  # readers that raise: corrupt, naming the path
                assert key in str(exc), exc
                return
    finally:
        sys.setrecursionlimit(limit)
    assert value is None, f"{reader} read a planted {bomb} record: {value!r:.200}"
    assert any(key in r.getMessage() for r in caplog.records), "the warning does not name the record"


def test_a_sink_claim_bomb_is_an_unreadable_claim(tmp_path: Any) -> None:
    from airflow_sparkpoint.storage import LocalStorage

    store = LocalStorage(str(tmp_path))
    store.put(manifests.manifest_key("orders", 3), _bombs(manifests.RECORD_LIMITS.max_bytes)["costly"])
    with pytest.raises(SinkError, match="parsing would take"):
        manifests.read_manifest(store, "orders", 3)


def test_reading_a_costly_metadata_holds_no_more_than_its_bytes(catalog: Catalog) -> None:
    """The listing's read of a planted ``_metadata`` (within the byte limit, 25 times that
    once parsed) is refused before it is parsed: its peak stays near the bytes read."""
    data = _bombs(8 << 20)["costly"]  # 8 MiB: ~200 MiB once parsed
    catalog.store.put(layout.checkpoint_metadata(4), data)
    tracemalloc.start()
    try:
        entries = catalog.list_checkpoints()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert entries[0].metadata is None and "parsing would take" in (entries[0].error or "")
    # The store's read copies the bytes a few times; a parse would take 20 times them.
    assert peak < 4 * len(data), f"the listing took {peak} bytes for a {len(data)}-byte _metadata"


def test_a_listing_keeps_summaries_not_every_snapshots_files(catalog: Catalog) -> None:
    from airflow_sparkpoint.checkpoints.history import snapshot_records
    from airflow_sparkpoint.checkpoints.metadata import FileRef

    catalog.claim_generation()
    refs = tuple(FileRef(f"state/0/{i}/1.delta", f"shared/state/0/{i}/1.delta~{i:016x}", 3, "0" * 64)
                 for i in range(50))
    for ref in refs:
        catalog.store.put(ref.key, b"abc")
    meta = SnapshotMetadata("checkpoint", 1, catalog.job, 1, 0, 1.0, refs)
    catalog.complete_checkpoint(meta)
    [entry] = catalog.list_checkpoints(slim=True)
    assert entry.metadata is None and entry.summary is not None and entry.valid
    [record] = snapshot_records(catalog, "checkpoint")
    assert ((record.file_count, record.bytes_total, record.state_partitions, record.status)
            == (50, 150, 50, "valid"))
    assert not hasattr(record, "metadata")


# ------------------------------------------------------------------ what the writers produce stays readable


def test_the_largest_records_sparkpoints_writers_produce_are_readable(catalog: Catalog) -> None:
    from airflow_sparkpoint.checkpoints.control import ControlResult
    from airflow_sparkpoint.checkpoints.counters import (
        RECENT_LIMIT,
        TREND_LIMIT,
        CheckpointCounters,
        CheckpointPoint,
    )
    from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
    from airflow_sparkpoint.checkpoints.retention import JOURNAL_KEYS_PER_ENTRY, journal_deletions
    from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
    from airflow_sparkpoint.checkpoints.verification import VerificationRecord, write_verification

    huge = "x" * 1_000_000 + "\U0001f600"
    catalog.write_status({"job": catalog.job, "generation": 3, "state": "failed", "started_at": 1.0,
                          "heartbeat_at": 2.0, "error": huge})
    assert catalog.read_status(3) is not None and "cut" in catalog.read_status()["error"]
    write_verification(catalog.store, "chk-4",
                       VerificationRecord(1.0, "drill", 2.0, {"files": 10}, error=huge))
    assert read_verification(catalog.store, "chk-4") is not None
    gaps = tuple((2 * i, 2 * i) for i in range(5_000))  # every other batch: 5,000 ranges
    write_run_result(catalog, RunResult("finished", catalog.job, 3, committed_batches=tuple(range(1000)),
                                        committed_ranges=gaps, recovered={"aborted": list(range(5_000)),
                                                                          "kept": list(range(5_000))}))
    result = read_run_result(catalog, 3)
    assert (result is not None and len(result.committed_ranges) == 1000
            and result.committed_ranges[-1] == gaps[-1])
    points = tuple(CheckpointPoint(i, i, 1e9 + i, 1000, 10**9, 10**12) for i in range(TREND_LIMIT))
    counters = CheckpointCounters(10**9, 10**6, 10**4,
                                  tuple((1e9 + i, i % 2 == 0) for i in range(RECENT_LIMIT)),
                                  12345, 1e9, points)
    # as `CounterRecorder` writes it
    catalog.store.put(layout.COUNTERS, json.dumps(counters.to_json()).encode())
    assert read_counters(catalog) == counters
    keys = [f"shared/state/{i % 4}/{i % 200}/SSTs/{i:06d}-0123456789abcdef.sst~0123456789abcdef"
            for i in range(2 * JOURNAL_KEYS_PER_ENTRY + 1)]
    journal_deletions(catalog, keys, 3)
    assert deleted_since(catalog, 0) == set(keys)
    result_json = ControlResult("1700000000000-0123abcd", "failed", 3, error=huge).to_json()
    assert len(json.dumps(result_json)) < layout.RECORD_MAX_BYTES[layout.CONTROL]
    # A batch staged by 200 tasks, each uploading a 5 GiB file in 1,000 parts.
    uploads = [{"key": f"out/part-orders-b1-g3-{i:05d}.parquet", "upload_id": "u" * 100, "size": 5 << 30,
                "rows": 10**6, "parts": [[n, f'"{n:032x}"'] for n in range(1, 1001)]} for i in range(200)]
    record = TransactionRecord(catalog.job, 1, 3, "s3", "s3://b/out", {"staged": {"uploads": uploads}})
    catalog.put_transaction(record)
    assert catalog.transactions() == [record]
