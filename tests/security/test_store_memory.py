"""A writer of the store cannot exhaust a reader's memory nor crash it (issue #46): a
record within its byte limit that parses to hundreds of megabytes, a record nested
deeper than Python's parser recurses, a snapshot file of any size where the restore
reads one whole. The store is a local directory, moto's S3 or SeaweedFS's.

Each test plants what a writer of the store could, and runs the reader a user runs
(`sparkpoint list`/`status`/`commit`, the UI page's read model, the sensor's poke, the
restore's sink-position check); memory is measured with tracemalloc (no timing)."""

from __future__ import annotations

import json
import os
import time
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.checkpoints.metadata import FileRef
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.exceptions import StorageError
from airflow_sparkpoint.storage import open_storage
from tests.support.records import checkpoint_at, snapshot_metadata

JOB = "orders"
MIB = 1 << 20


def costly(size: int) -> bytes:
    """A JSON object of `size` bytes that parses to ~25 times that (empty objects)."""
    count = (size - 16) // 3
    return b'{"pad":[' + b",".join([b"{}"] * count) + b"]}"


def deep(depth: int = 30_000) -> bytes:
    """A JSON object nested `depth` levels: Python's parser raises RecursionError."""
    return b'{"pad":' + b"[" * depth + b"]" * depth + b"}"


def peak_of(action: Callable[[], Any]) -> tuple[Any, int]:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = action()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


class Store:
    """A job's store and how the CLI reaches it."""

    def __init__(self, root: str, options: dict[str, Any], cli: list[str]) -> None:
        self.root, self.options, self.cli = root, options, cli
        self.catalog = Catalog(open_storage(root, **options), JOB)


@pytest.fixture(params=["local", "moto", "seaweedfs"])
def store(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    if request.param == "local":
        yield Store(str(tmp_path / "store"), {}, ["--dir", str(tmp_path / "store")])
        return
    import boto3

    endpoint = request.getfixturevalue("s3_server" if request.param == "moto" else "seaweedfs_server")
    bucket = f"sp-{uuid.uuid4().hex[:12]}"
    options = {"endpoint_url": endpoint, "region_name": "us-east-1", "aws_access_key_id": "test",
               "aws_secret_access_key": "test"}
    boto3.client("s3", **options).create_bucket(Bucket=bucket)
    for name, value in (("AWS_ACCESS_KEY_ID", "test"), ("AWS_SECRET_ACCESS_KEY", "test")):
        monkeypatch.setenv(name, value)
    yield Store(f"s3://{bucket}/root", options, ["--dir", f"s3://{bucket}/root", "--s3-endpoint", endpoint,
                                                 "--s3-region", "us-east-1"])


def cli(capsys: pytest.CaptureFixture[str], store: Store, *args: str) -> tuple[int, str, str]:
    code = main([args[0], *store.cli, "--job", JOB, *args[1:]])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------- nesting: never a RecursionError


@pytest.mark.s3
def test_a_deeply_nested_status_neither_crashes_status_nor_hides_the_job(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint_at(store.catalog, 3)
    store.catalog.store.put("status.json", deep())
    code, out, err = cli(capsys, store, "status", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["latest_checkpoint"]["batch_id"] == 3  # the job is still described
    assert "status.json" in err and "unreadable" in err  # the planted record is named as corrupt


@pytest.mark.s3
def test_a_deeply_nested_transaction_record_neither_crashes_commit_nor_is_settled(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint_at(store.catalog, 3)
    store.catalog.store.put("txn/000000000002-g000001.json", deep())
    code, out, err = cli(capsys, store, "commit", "--json")
    assert code == 0, err
    assert json.loads(out)["result"]["aborted"] == []
    assert "txn/000000000002-g000001.json" in err and "unreadable" in err
    assert store.catalog.store.exists("txn/000000000002-g000001.json")  # left for a person to look at


# ------------------------------------------------------------------- memory: bounded by what parsing costs


def _snapshot_with_a_costly_metadata(store: Store) -> None:
    """Two good checkpoints and, newest, one whose ``_metadata`` is 8 MiB (well within the
    bytes a snapshot's metadata may have) and would take ~200 MiB parsed."""
    checkpoint_at(store.catalog, 1)
    checkpoint_at(store.catalog, 2)
    store.catalog.store.put("chk-9/_metadata", costly(8 * MIB))


@pytest.mark.s3
def test_sparkpoint_list_does_not_parse_a_costly_metadata(
    store: Store, capsys: pytest.CaptureFixture[str]
) -> None:
    _snapshot_with_a_costly_metadata(store)
    code, peak = peak_of(lambda: cli(capsys, store, "list", "--json")[0])
    assert code == 0
    assert peak < 40 * MIB, f"sparkpoint list took {peak / MIB:.0f} MiB for an 8 MiB _metadata"


@pytest.mark.s3
def test_the_page_and_the_sensor_do_not_parse_a_costly_metadata(store: Store) -> None:
    from airflow_sparkpoint.services.conditions import CheckpointCondition, evaluate

    _snapshot_with_a_costly_metadata(store)
    history, peak = peak_of(lambda: load_history(store.catalog))  # the UI page's read model
    assert peak < 40 * MIB, f"the page's read model took {peak / MIB:.0f} MiB"
    bad = next(r for r in history.checkpoints if r.id == 9)
    assert not bad.valid and "_metadata" in (bad.error or "")
    outcome, peak = peak_of(lambda: evaluate(store.catalog,
                                             CheckpointCondition(job_name=JOB, min_checkpoints=2)))
    assert peak < 40 * MIB, f"a sensor poke took {peak / MIB:.0f} MiB"
    assert outcome.done and outcome.payload["batch_id"] == 2


@pytest.mark.s3
def test_the_commit_step_does_not_parse_a_costly_transaction_record(
        store: Store, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint_at(store.catalog, 3)
    store.catalog.store.put("txn/000000000002-g000001.json", costly(12 * MIB))  # ~300 MiB parsed
    (code, _out, err), peak = peak_of(lambda: cli(capsys, store, "commit", "--json"))
    assert code == 0, err
    assert peak < 60 * MIB, f"sparkpoint commit took {peak / MIB:.0f} MiB for a 12 MiB record"


# ------------------------------------------------------------------- snapshot files read whole


def _snapshot_with_a_huge_offsets_file(store: Store, size: int) -> Any:
    """A checkpoint whose ``offsets/<batch>`` is `size` bytes (a sparse file locally)."""
    key = "shared/offsets/3~0123456789abcdef"
    if store.root.startswith("s3://"):
        store.catalog.store.put(key, b"v1\n" + b" " * (size - 3))
    else:
        path = Path(store.root) / JOB / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as handle:
            handle.truncate(size)
    store.catalog.claim_generation()
    meta = snapshot_metadata(3, snapshot_id=5, job=JOB, created_at=time.time(),
                             files=(FileRef("offsets/3", key, size, "0" * 64),))
    store.catalog.complete_checkpoint(meta)
    return store.catalog.snapshot(5)


@pytest.mark.s3
def test_the_sink_position_check_refuses_a_huge_offsets_file(store: Store) -> None:
    from airflow_sparkpoint.runtime.replay import snapshot_offsets

    size = 8 * MIB if store.root.startswith("s3://") else 1 << 30  # sparse on local disk
    handle = _snapshot_with_a_huge_offsets_file(store, size)
    with pytest.raises(StorageError, match="offsets/3") as info:
        peak_of(lambda: snapshot_offsets(handle))
    assert "limit" in str(info.value)


def test_the_offsets_file_of_a_real_checkpoint_is_read(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.replay import snapshot_offsets

    catalog = Catalog(open_storage(str(tmp_path / "store")), JOB)
    catalog.claim_generation()
    body = b'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n{"logOffset":3}'
    catalog.store.put("shared/offsets/3~0123456789abcdef", body)
    catalog.complete_checkpoint(snapshot_metadata(3, snapshot_id=5, job=JOB, created_at=time.time(),
                                                  files=(FileRef("offsets/3",
                                                                 "shared/offsets/3~0123456789abcdef",
                                                                 len(body), "0" * 64),)))
    assert snapshot_offsets(catalog.snapshot(5)) == body.decode()
    assert os.path.exists(tmp_path / "store" / JOB / "chk-5" / "_metadata")
