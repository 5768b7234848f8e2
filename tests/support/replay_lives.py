"""Live locations of a file-source query and the replay records blue leaves, without
Spark (`runtime.replay`, the shadow's follow mode)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from tests.support.records import transaction_record

__all__ = ["META", "entry", "live", "offsets_text", "pending", "snapshot_at"]

META = '{"batchWatermarkMs":0,"batchTimestampMs":%d,"conf":{"spark.sql.shuffle.partitions":"1"}}'


def offsets_text(batch: int, *lines: str) -> str:
    return "\n".join(["v1", META % (1000 + batch), *lines])


def entry(path: str, batch: int) -> str:
    return json.dumps({"path": path, "timestamp": 1, "batchId": batch}, separators=(",", ":"))


def live(tmp_path: Path, batches: int, compact_at: int | None = None) -> Path:
    """A live location after `batches` batches of one file source, one file each."""
    root = tmp_path / "live"
    (root / "offsets").mkdir(parents=True)
    (root / "sources" / "0").mkdir(parents=True)
    everything: list[str] = []
    for n in range(batches):
        (root / "offsets" / str(n)).write_text(offsets_text(n, json.dumps({"logOffset": n})))
        everything.append(entry(f"file:///in/f{n}.json", n))
        if n == compact_at:
            (root / "sources" / "0" / f"{n}.compact").write_text("\n".join(["v1", *everything]))
        else:
            (root / "sources" / "0" / str(n)).write_text("\n".join(["v1", everything[-1]]))
    return root


def snapshot_at(root: Path, batch: int) -> Any:
    from airflow_sparkpoint.checkpoints import FileRef, SnapshotHandle
    from airflow_sparkpoint.storage import LocalStorage

    offsets = root / "offsets" / str(batch)
    files = [FileRef(f"offsets/{batch}", f"offsets/{batch}", offsets.stat().st_size, "0" * 64)]
    return SnapshotHandle("file:///chk-1", SimpleNamespace(batch_id=batch, files=files),  # type: ignore[arg-type]
                          LocalStorage(str(root)))


def pending(catalog: Catalog, batch: int, generation: int, replay_text: str | None) -> None:
    """A pending transaction record of `batch` by `generation`, carrying `replay_text`."""
    payload: dict[str, Any] = {"staged": {}}
    if replay_text is not None:
        payload["replay"] = replay_text
    catalog.put_transaction(transaction_record("delta", batch, generation, job=catalog.job,
                                               sink_id="fake:blue", payload=payload, created_at=0.0))
