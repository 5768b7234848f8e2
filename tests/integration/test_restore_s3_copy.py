"""Issue 32, the first checkpoint after a restore on S3: a job restored from a savepoint in
the same S3 service stores the savepoint's files in its own shared area by server-side
copy (CopyObject), never by uploading their bytes again from the driver; its output is
exact; its retention never touches the savepoint, which still restores afterwards.

On moto and SeaweedFS, both ``slow`` (three short jobs, 20 to 48 s each: the default run is
at its 40-minute budget; there `tests/unit/runtime/test_prestore.py` guards the copy). One job writes 2
batches and a savepoint of its latest checkpoint; a second root restores it
(`numRetained=1`, so retention deletes every checkpoint but the last and, after the grace
period, the copies of the savepoint's files the newest no longer references) over 3 more
batches; then every object of that root is deleted and a third root restores the same
savepoint. Every job runs in this process on the package's Spark session (no
``spark-submit``), so the job's store is wrapped in a `CountingStorage` that logs every
request. The oracle is computed from the input in plain Python.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, open_snapshot
from airflow_sparkpoint.storage import open_storage
from airflow_sparkpoint.storage.counting import CountingStorage
from tests.support.inputs import expected_totals, write_event_files
from tests.support.s3_servers import S3Context, new_bucket
from tests.support.state_cases import aggregation, table_rows

pytestmark = [pytest.mark.spark, pytest.mark.s3, pytest.mark.slow]

JOB = "totals"
USERS = 4


@pytest.fixture(params=["moto", "seaweedfs"])
def s3(request: pytest.FixtureRequest) -> S3Context:
    """A fresh bucket on moto (in a child process: this process runs Spark and delta-rs
    too) or on SeaweedFS, whose CopyObject is its own implementation."""
    fixture = "s3_server_process" if request.param == "moto" else "seaweedfs_server"
    return new_bucket(str(request.getfixturevalue(fixture)), request.param)


@pytest.fixture()
def counted(monkeypatch: pytest.MonkeyPatch) -> list[CountingStorage]:
    """Every store a job opens for its root, wrapped in a `CountingStorage` (newest last)."""
    from airflow_sparkpoint.runtime import run_startup

    stores: list[CountingStorage] = []

    def counting(uri: str, **options: Any) -> CountingStorage:
        stores.append(CountingStorage(open_storage(uri, **options)))
        return stores[-1]

    monkeypatch.setattr(run_startup, "open_storage", counting)
    return stores


def run_job(spark: Any, s3: S3Context, root: str, work: Path, inputs: Path, table: Path, *,
            restore: str = "latest", retained: int = 3) -> Any:
    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DeltaSink

    job = SparkpointJob.get_or_create(conf={
        "spark.sparkpoint.dir": root, "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": restore,
        "spark.sparkpoint.workDir": str(work), "spark.sparkpoint.stateStore": "rocksdb",
        "spark.sparkpoint.checkpoint.numRetained": str(retained),
        # Retention's grace for unreferenced shared files: short, so this run collects the
        # copies of the savepoint's files its newest checkpoint no longer references.
        "spark.sparkpoint.checkpoint.timeout": "1s",
        **s3.conf(),
    }, argv=[])
    return job.run(aggregation(spark, inputs), sink=DeltaSink(str(table), mode="merge", keys=["user"]),
                   output_mode="update")


def listing(s3: S3Context, prefix: str) -> dict[str, tuple[int, str]]:
    """key -> (size, etag) of every object under `prefix` of the bucket."""
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return {o["Key"]: (o["Size"], o["ETag"]) for page in pages for o in page.get("Contents", ())}


def test_the_first_checkpoint_after_a_restore_copies_the_savepoint_server_side(
        spark, s3, tmp_path, counted):
    inputs = tmp_path / "input"
    rows = write_event_files(inputs, 2, USERS)
    blue = f"s3://{s3.bucket}/blue"
    first = run_job(spark, s3, blue, tmp_path / "blue-work", inputs, tmp_path / "blue-table")
    assert first.status == "finished" and first.last_batch == 1, first
    catalog = Catalog.open(blue, JOB, **s3.options())
    taken = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
    savepoint = open_snapshot(taken.uri, storage_options=s3.options())
    saved_prefix = taken.uri.split(f"s3://{s3.bucket}/", 1)[1] + "/"
    saved_objects = listing(s3, saved_prefix)
    assert len(saved_objects) > len(savepoint.metadata.files) > 0, saved_objects
    # Both restores start from the sink as the savepoint left it (blue's table at batch 1).
    for name in ("green-table", "again-table"):
        shutil.copytree(tmp_path / "blue-table", tmp_path / name)
    rows += write_event_files(inputs, 3, USERS, start=2)

    green = f"s3://{s3.bucket}/green"
    counted.clear()
    second = run_job(spark, s3, green, tmp_path / "green-work", inputs, tmp_path / "green-table",
                     restore=taken.uri, retained=1)
    assert second.status == "finished" and second.restored_from == taken.uri, second
    assert (second.first_batch, second.last_batch) == (2, 4), second
    assert totals_in(tmp_path / "green-table") == expected_totals(rows)

    store = counted[0]
    green_catalog = Catalog(store.inner, JOB)
    # The savepoint's files under their content-addressed keys in green's shared area:
    own_keys = {f"{JOB}/{green_catalog.shared_key(ref.path, ref.sha256)}" for ref in savepoint.metadata.files}
    uploaded = {key for op, key in store.log if op in ("upload_file", "put", "put_if_absent")}
    copied = {key for op, key in store.log if op == "copy_from"}
    # no byte of them passed through the driver
    assert uploaded & own_keys == set(), sorted(uploaded & own_keys)
    assert own_keys & copied, "the savepoint's files were not copied into green's shared area"
    restored_state = {key for key in own_keys if "/state/" in f"/{key}"}
    assert restored_state and restored_state <= copied, sorted(restored_state - copied)
    assert store.kinds["DELETE"] >= 1, \
        "retention deleted nothing: the test would not see it touch the savepoint"
    assert listing(s3, saved_prefix) == saved_objects, "green's retention touched the savepoint"
    # Green's copies are its own: with every object of its root deleted, the savepoint still restores.
    doomed = list(listing(s3, "green/"))
    assert own_keys & {key.removeprefix("green/") for key in doomed}, \
        "green holds no copy of the savepoint's files"
    s3.client().delete_objects(Bucket=s3.bucket, Delete={"Objects": [{"Key": key} for key in doomed]})

    again = run_job(spark, s3, f"s3://{s3.bucket}/again", tmp_path / "again-work", inputs,
                    tmp_path / "again-table", restore=taken.uri)
    assert again.status == "finished" and again.restored_from == taken.uri and again.first_batch == 2, again
    assert totals_in(tmp_path / "again-table") == expected_totals(rows)
    assert listing(s3, saved_prefix) == saved_objects



def totals_in(table: Path) -> dict[str, tuple[int, int]]:
    return {row["user"]: (row["total"], row["n"]) for row in table_rows(table)}
