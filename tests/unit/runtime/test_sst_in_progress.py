"""Spark's RocksDB maintenance writes a snapshot's SST files in place (``state/.../SSTs/``)
and only then the ``.zip`` that references them, so a checkpoint can meet an SST that is
still being written (seen at 20 M keys on S3: "live file ...sst changed while
checkpointing", and with ``tolerableFailures=0`` the job failed). Such a file is copied
again once a copy saw no change; one that vanished (maintenance deletes only SSTs no
retained version references) is left out. Any other file that changes still fails the
checkpoint: Spark writes those once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.checkpointers import checkpointer
from tests.support.fake_sinks import RecordingSink
from tests.support.live_dirs import write_live

SST = "state/0/0/SSTs/000023-218f2722-c298-4756-aaed-682191a90ea3.sst"


class Meddling(MemoryStorage):
    """Runs `meddle(key)` before the first upload of a key containing `target`."""

    def __init__(self, target: str, meddle) -> None:
        super().__init__(uuid.uuid4().hex)
        self.target = target
        self.meddle = meddle
        self.fired = 0

    def upload_file(self, local_path: str, key: str) -> None:
        if self.target in key and not self.fired:
            self.fired += 1
            self.meddle(local_path)
        super().upload_file(local_path, key)


def _run(tmp_path: Path, target: str, meddle) -> tuple[Catalog, Meddling, object, Path]:
    store = Meddling(target, meddle)
    catalog = Catalog(store, "job")
    live = tmp_path / "live"
    write_live(live, 0)
    sst = live / SST
    sst.parent.mkdir(parents=True)
    sst.write_bytes(b"a" * 1000)  # the part written so far
    coord = checkpointer(catalog, live, RecordingSink(), catalog.claim_generation().generation)
    return catalog, store, coord, live


def test_an_sst_still_being_written_is_copied_once_complete(tmp_path):
    def append(path: str) -> None:  # Spark's maintenance goes on writing it
        with open(path, "ab") as handle:
            handle.write(b"b" * 5000)

    catalog, store, coord, live = _run(tmp_path, "SSTs/", append)
    meta = coord.checkpoint(0)

    assert store.fired == 1, "the SST did not change during the checkpoint"
    assert meta is not None
    ref = next(f for f in meta.files if f.path == SST)
    assert ref.size == 6000 and catalog.store.get(ref.key) == (live / SST).read_bytes()


def test_an_sst_that_vanished_is_left_out(tmp_path):
    _catalog, store, coord, _live = _run(tmp_path, "SSTs/", lambda path: Path(path).unlink())
    meta = coord.checkpoint(0)

    assert store.fired == 1 and meta is not None
    assert SST not in {f.path for f in meta.files}
    assert {"offsets/0", "commits/0", "state/0/0/1.changelog"} <= {f.path for f in meta.files}


def test_any_other_file_that_changes_still_fails_the_checkpoint(tmp_path):
    def rewrite(path: str) -> None:
        with open(path, "ab") as handle:
            handle.write(b"more")

    _catalog, store, coord, _live = _run(tmp_path, "1.changelog", rewrite)
    with pytest.raises(SparkpointError, match="changed while checkpointing"):
        coord.checkpoint(0)
    assert store.fired == 1
