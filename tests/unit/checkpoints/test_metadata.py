"""The metadata model: JSON round trips, checksums, schema versions, hostile content."""

from __future__ import annotations

import json

import pytest

from airflow_sparkpoint.checkpoints.metadata import (
    FileRef,
    SnapshotMetadata,
    SnapshotStats,
    TransactionRecord,
    canonical_json,
    sha256_hex,
)
from airflow_sparkpoint.exceptions import CorruptMetadata


def sample() -> SnapshotMetadata:
    txn = TransactionRecord("orders", 7, 2, "DeltaSink", "sink-1", {"files": ["a.parquet"], "é": 1}, 12.5)
    return SnapshotMetadata(
        kind="checkpoint",
        id=9,
        job="orders",
        generation=2,
        batch_id=7,
        created_at=1_712_345_678.123456,
        files=(
            FileRef("offsets/7", "shared/offsets/7~0123456789abcdef", 120, "ab" * 32,
                    1_712_345_678_000_000_000),
            FileRef("state/0/1/3.zip", "shared/state/0/1/3.zip~fedcba9876543210", 4096, "cd" * 32),
        ),
        live_root="/tmp/live",
        transactions=(txn,),
        sink_positions={"delta": {"version": 41}},
        stats=SnapshotStats(duration_ms=31, bytes_copied=4216, files_copied=2, bytes_total=4216,
                            file_count=2),
        spark={"version": "4.2.0", "query_id": "q"},
        source_checkpoint=None,
    )


def test_json_round_trip() -> None:
    meta = sample()
    data = meta.to_bytes()
    again = SnapshotMetadata.from_bytes(data)
    assert again == meta
    assert again.to_bytes() == data  # deterministic
    assert meta.total_bytes == 120 + 4096
    body = json.loads(data)
    assert body["schema_version"] == 1 and body["checksum"].startswith("sha256:")


def test_savepoint_round_trip_keeps_source_checkpoint() -> None:
    meta = sample().with_(kind="savepoint", source_checkpoint=9)
    assert SnapshotMetadata.from_bytes(meta.to_bytes()) == meta


def test_transaction_record_round_trip() -> None:
    record = sample().transactions[0]
    assert TransactionRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    assert record.txn_id == "orders-b7-g2"
    with pytest.raises(CorruptMetadata, match="schema_version 2"):
        TransactionRecord.from_json({**record.to_json(), "schema_version": 2})


@pytest.mark.parametrize("mask", [0x01, 0x20, 0x80])
def test_checksum_detects_any_modified_byte(mask: int) -> None:
    data = sample().to_bytes()
    for position in range(len(data)):
        damaged = bytearray(data)
        damaged[position] ^= mask
        with pytest.raises(CorruptMetadata, match="_metadata"):
            SnapshotMetadata.from_bytes(bytes(damaged))


def test_every_truncation_is_detected() -> None:
    data = sample().to_bytes()
    for length in range(len(data)):
        with pytest.raises(CorruptMetadata):
            SnapshotMetadata.from_bytes(data[:length], where="s3://b/orders/chk-9/_metadata")


def test_errors_name_the_path() -> None:
    where = "s3://b/orders/chk-9/_metadata"
    with pytest.raises(CorruptMetadata, match=f"^{where}: not valid JSON"):
        SnapshotMetadata.from_bytes(b"\x00garbage", where=where)
    with pytest.raises(CorruptMetadata, match=f"^{where}: expected a JSON object"):
        SnapshotMetadata.from_bytes(b"[1, 2]", where=where)
    with pytest.raises(CorruptMetadata, match=f"^{where}: missing checksum"):
        SnapshotMetadata.from_bytes(b"{}", where=where)


def _resigned(body: dict) -> bytes:
    body = {k: v for k, v in body.items() if k != "checksum"}
    body["checksum"] = "sha256:" + sha256_hex(canonical_json(body))
    return json.dumps(body).encode()


def test_future_schema_version_is_refused_even_with_a_valid_checksum() -> None:
    body = sample().to_json()
    body["schema_version"] = 2
    with pytest.raises(CorruptMetadata, match="schema_version 2 is not supported; this release reads 1..1"):
        SnapshotMetadata.from_bytes(_resigned(body))


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"kind": "snapshot"}, "kind 'snapshot'"),
        ({"id": "nine"}, "malformed field"),
        ({"files": [{"path": "x"}]}, "malformed field"),
        ({"files": [{"path": "x", "key": "../../etc/passwd", "size": 1, "sha256": "00"}]}, "malformed field"),
        ({"files": [{"path": "x", "key": "/abs", "size": 1, "sha256": "00"}]}, "malformed field"),
        ({"source_checkpoint": "x"}, "malformed field"),
        ({"schema_version": True}, "schema_version True"),
    ],
)
def test_well_signed_but_malformed_content_is_refused(change: dict, reason: str) -> None:
    body = {**sample().to_json(), **change}
    with pytest.raises(CorruptMetadata, match=reason):
        SnapshotMetadata.from_bytes(_resigned(body))


def test_no_pickle_anywhere() -> None:
    data = sample().to_bytes()
    json.loads(data)  # plain JSON, readable by any tool
    assert data.startswith(b"{")


def test_state_partitions_come_from_the_snapshots_own_files():
    from airflow_sparkpoint.checkpoints.metadata import FileRef, SnapshotMetadata

    def ref(path):
        return FileRef(path=path, key=f"shared/{path}", size=1, sha256="0" * 64)

    files = (ref("metadata"), ref("offsets/3"), ref("state/0/_metadata/v2/3"),
             *(ref(f"state/0/{p}/4.changelog") for p in range(4)),
             *(ref(f"state/1/{p}/left-keyToNumValues/4.delta") for p in range(2)))
    meta = SnapshotMetadata(kind="checkpoint", id=1, job="j", generation=1, batch_id=3, created_at=0.0,
                            files=files)
    assert meta.partitions_by_operator == {0: 4, 1: 2}
    assert meta.state_partitions == 4
    assert meta.with_(files=(ref("metadata"), ref("offsets/3"))).state_partitions is None


def test_a_file_refs_json_has_every_field() -> None:
    """`FileRef.to_json` names its fields by hand (asdict was the checkpoint's hot spot):
    a field added to the class and not to the JSON would be lost from every `_metadata`."""
    import dataclasses

    ref = FileRef(path="state/0/1/3.zip", key="shared/ab/cd", size=12, sha256="e" * 64, mtime_ns=5)
    assert ref.to_json() == dataclasses.asdict(ref)
    assert FileRef.from_json(ref.to_json()) == ref
