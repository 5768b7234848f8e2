"""The read-only pre-check of ``restore.statePartitions`` and the corrections made to a
rescaled private live copy (no Spark: the repartitioner itself is exercised by
``tests/integration/test_rescale.py``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import SnapshotHandle
from airflow_sparkpoint.checkpoints.metadata import FileRef
from airflow_sparkpoint.exceptions import ConfigError, RestoreError
from airflow_sparkpoint.runtime import rescale
from airflow_sparkpoint.runtime.restore import RestorePlan
from airflow_sparkpoint.storage.localfs import Dir
from airflow_sparkpoint.storage.memory import MemoryStorage
from tests.support.records import snapshot_metadata

ROCKSDB = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


def offsets(partitions: int, provider: str = ROCKSDB) -> bytes:
    meta = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": str(partitions),
                                            "spark.sql.streaming.stateStore.providerClass": provider}}
    return ("v1\n" + json.dumps(meta) + '\n{"logOffset":1}').encode()


def op_metadata_v1(op: int, name: str, partitions: int) -> bytes:
    body = {"operatorInfo": {"operatorId": op, "operatorName": name},
            "stateStoreInfo": [{"storeName": "default", "numColsPrefixKey": 0, "numPartitions": partitions}]}
    return ("v1\n" + json.dumps(body)).encode()


def snapshot(files: dict[str, bytes], batch: int = 2) -> RestorePlan:
    store = MemoryStorage(f"rescale-{uuid.uuid4().hex}")
    refs = []
    for path, data in files.items():
        store.put(f"files/{path}", data)
        refs.append(FileRef(path=path, key=f"files/{path}", size=len(data), sha256="0" * 64))
    meta = snapshot_metadata(batch, kind="savepoint", files=refs)
    return RestorePlan(SnapshotHandle("memory://sp/savepoint-1", meta, store), "savepoint", "savepoint")


def aggregation(partitions: int = 2, name: str = "stateStoreSave") -> dict[str, bytes]:
    files = {"offsets/2": offsets(partitions),
             "state/0/_metadata/metadata": op_metadata_v1(0, name, partitions)}
    files.update({f"state/0/{p}/3.changelog": b"x" for p in range(partitions)})
    return files


def test_plan_reads_partitions_from_the_offset_log_and_operators_from_their_metadata():
    plan = rescale.plan_rescale(4, snapshot(aggregation(2)))
    assert plan == rescale.RescalePlan(4, 2, 2, ((0, "stateStoreSave"),)) and plan.needed
    assert "from 2 to 4" in plan.describe() and "0 (stateStoreSave)" in plan.describe()
    same = rescale.plan_rescale(2, snapshot(aggregation(2)))
    assert same is not None and not same.needed and "already has 2" in same.describe()
    assert rescale.plan_rescale(None, snapshot(aggregation(2))) is None


def test_transform_with_state_uses_the_newest_v2_metadata_up_to_the_batch():
    files = {"offsets/5": offsets(3), "state/0/0/6.changelog": b"x",
             "state/0/_metadata/v2/1": b'v2\n{"operatorInfo":{"operatorId":0,"operatorName":"globalLimit"}}',
             "state/0/_metadata/v2/4": b'v2\n{"operatorInfo":{"operatorId":0,'
                                       b'"operatorName":"transformWithStateInPandasExec"}}',
             "state/0/_metadata/v2/7": b'v2\n{"operatorInfo":{"operatorId":0,"operatorName":"globalLimit"}}'}
    plan = rescale.plan_rescale(5, snapshot(files, batch=5))
    assert plan is not None and plan.operators == ((0, "transformWithStateInPandasExec"),) and plan.needed


def test_an_unsupported_operator_is_refused_by_name():
    with pytest.raises(RestoreError, match=r"statePartitions=4: operator 0 \(globalLimit\) of memory://sp/"
                                           r"savepoint-1 cannot be repartitioned.*supports .*stateStoreSave"):
        rescale.plan_rescale(4, snapshot(aggregation(2, name="globalLimit")))
    # restoring it with its own number is no rescale: allowed
    assert not rescale.plan_rescale(2, snapshot(aggregation(2, name="globalLimit"))).needed  # type: ignore[union-attr]


def test_snapshots_without_what_the_repartitioner_needs_are_refused():
    files = aggregation(2)
    del files["state/0/_metadata/metadata"]
    with pytest.raises(RestoreError, match="operator 0 has no operator metadata"):
        rescale.plan_rescale(4, snapshot(files))
    with pytest.raises(RestoreError, match="no offset log entry offsets/2"):
        rescale.plan_rescale(4, snapshot({"state/0/_metadata/metadata": op_metadata_v1(0, "dedupe", 2)}))


def test_empty_and_stateless_restores_need_no_repartition():
    empty = rescale.plan_rescale(3, RestorePlan(None, "empty state"))
    assert (empty == rescale.RescalePlan(3) and not empty.needed
            and "empty state starts with 3" in empty.describe())
    stateless = rescale.plan_rescale(3, snapshot({"offsets/2": offsets(2)}))
    assert stateless is not None and not stateless.needed and "no stateful operator" in stateless.describe()


@pytest.mark.parametrize("target", [0, -1, True, "4"])
def test_bad_targets_are_config_errors(target):
    with pytest.raises(ConfigError, match=r"statePartitions=.* is invalid; expected an integer >= 1"):
        rescale.plan_rescale(target, RestorePlan(None, "empty state"))  # type: ignore[arg-type]


def test_contradicting_shuffle_partitions_are_refused():
    plan = rescale.RescalePlan(4)
    rescale.check_shuffle_partitions({}, plan)
    rescale.check_shuffle_partitions({"spark.sql.shuffle.partitions": "4"}, plan)
    rescale.check_shuffle_partitions({"spark.sql.shuffle.partitions": "200"}, None)
    with pytest.raises(ConfigError, match="spark.sql.shuffle.partitions=200 contradicts .*statePartitions=4"):
        rescale.check_shuffle_partitions({"spark.sql.shuffle.partitions": "200"}, plan)


def write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())


def test_a_rescaled_copy_gets_its_v1_metadata_and_dropped_partitions_corrected(tmp_path):
    original = tmp_path / "elsewhere"
    write(original, op_metadata_v1(0, "stateStoreSave", 4))
    target = tmp_path / "live/state/0/_metadata/metadata"
    target.parent.mkdir(parents=True)
    target.hardlink_to(original)  # materialized by hard link: must not be changed in place
    write(tmp_path / "live/state/0/_metadata/.metadata.crc", b"old")
    for p in range(4):
        write(tmp_path / f"live/state/0/{p}/5.zip", b"x")
    with Dir.open(str(tmp_path / "live")) as location:
        rescale._fix_v1_metadata(location, 2)
        assert rescale._remove_dropped_partitions(location, 2) == 2
    body = json.loads(target.read_text().splitlines()[1])
    assert [s["numPartitions"] for s in body["stateStoreInfo"]] == [2]
    assert json.loads(original.read_text().splitlines()[1])["stateStoreInfo"][0]["numPartitions"] == 4
    assert not (tmp_path / "live/state/0/_metadata/.metadata.crc").exists()
    assert sorted(p.name for p in (tmp_path / "live/state/0").iterdir()) == ["0", "1", "_metadata"]


def test_an_interrupted_repartition_is_recognised(tmp_path):
    live = tmp_path / "live"
    write(live / "offsets/2", offsets(2))
    write(live / "commits/2", b"v1\n{}")
    assert not rescale.interrupted(str(live), 2)
    write(live / "offsets/3", offsets(2))  # an ordinary batch in flight
    assert not rescale.interrupted(str(live), 2)
    write(live / "offsets/3", offsets(4))  # the repartitioner's batch, not committed
    assert rescale.interrupted(str(live), 2)
    write(live / "commits/3", b"v1\n{}")
    assert not rescale.interrupted(str(live), 2)


def test_state_of_another_provider_than_rocksdb_is_refused():
    files = {**aggregation(2), "offsets/2": offsets(2, HDFS)}
    with pytest.raises(RestoreError,
                       match="HDFSBackedStateStoreProvider; Spark's offline state repartitioner "
                             "supports RocksDB state only"):
        rescale.plan_rescale(4, snapshot(files))
    assert not rescale.plan_rescale(2, snapshot(files)).needed  # type: ignore[union-attr]
