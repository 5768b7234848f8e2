"""Shadow follow mode (`runtime.follow`) without Spark: its settings, the refusals made
before anything is written, blue's records as the shadow reads them, the shadow sink and
the progress record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.follow_record import FollowProgress, read_follow, write_follow
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord, SparkpointError
from airflow_sparkpoint.runtime import follow, replay
from airflow_sparkpoint.runtime.config import PREFIX, SparkpointConfig
from airflow_sparkpoint.sinks.registry import sink_from_config
from airflow_sparkpoint.sinks.shadow import ShadowSink
from airflow_sparkpoint.storage import LocalStorage
from tests.support.fake_sinks import ReplayRecordSink
from tests.support.replay_lives import live, pending
from tests.support.replay_lives import snapshot_at as _snapshot_at


def snapshot_at(root: Path, batch: int) -> Any:
    """A checkpoint of blue's job 'orders' at `batch` over the live location `root`."""
    handle = _snapshot_at(root, batch)
    handle.metadata.job = "orders"
    return handle

BASE = {f"{PREFIX}dir": "/tmp/sp", f"{PREFIX}job": "orders"}


def shadow_conf(**extra: str) -> dict[str, str]:
    return {**BASE, **{f"{PREFIX}shadow.{k}": v for k, v in extra.items()}}


# -- settings -----------------------------------------------------------------------------


def test_no_shadow_key_is_a_normal_run_and_defaults_are_documented():
    assert SparkpointConfig.from_conf(BASE).shadow is None
    shadow = SparkpointConfig.from_conf(shadow_conf(mode="discard", dir="/tmp/scratch")).shadow
    assert shadow is not None
    assert (shadow.job, shadow.source, shadow.work_dir, shadow.until_batch, shadow.poll_interval_s) == (
        "orders-shadow", "latest", None, None, 1.0)


@pytest.mark.parametrize(("extra", "message"), [
    ({"dir": "/tmp/scratch"}, r"shadow\.dir is set but spark\.sparkpoint\.shadow\.mode is not"),
    ({"mode": "mirror", "dir": "/tmp/scratch"}, r"shadow\.mode='mirror'"),
    ({"mode": "discard"}, r"shadow\.dir is required"),
    ({"mode": "discard", "dir": "/tmp/sp", "job": "orders"}, r"is blue's own job"),
    ({"mode": "discard", "dir": "/tmp/scratch", "untilBatch": "-1"}, r"shadow\.untilBatch='-1'"),
    ({"mode": "discard", "dir": "/tmp/scratch", "pollInterval": "0s"},
     r"shadow\.pollInterval='0s' must be positive"),
    ({"mode": "discard", "dir": "/tmp/scratch", "job": "../x"}, r"\.\./x"),
    ({"mode": "discard", "dir": "/tmp/scratch", "workDir": "/tmp/sp/orders/live/"},
     r"blue's own live location root"),
])
def test_bad_shadow_settings_fail_naming_the_key(extra: dict[str, str], message: str):
    with pytest.raises(ConfigError, match=message):
        SparkpointConfig.from_conf(shadow_conf(**extra))


def test_the_shadow_run_is_blue_settings_in_its_own_root_restoring_blue_as_a_foreign_snapshot(tmp_path: Path):
    cfg = SparkpointConfig.from_conf({**shadow_conf(mode="discard", dir="/tmp/scratch"),
                                      f"{PREFIX}commit.mode": "external", f"{PREFIX}takeover": "true",
                                      f"{PREFIX}checkpoint.interval": "1min"})
    start = snapshot_at(live(tmp_path, 3), 2)
    scratch = follow.shadow_config(cfg, start)
    assert (scratch.dir, scratch.job, scratch.restore, scratch.restore_allow_foreign_job) == (
        "/tmp/scratch", "orders-shadow", start.uri, True)
    assert (scratch.commit_mode, scratch.takeover, scratch.checkpoint_interval_s, scratch.shadow) == (
        "checkpoint", False, 0.0, None)


# -- refusals before anything is written ----------------------------------------------------


def test_a_counter_source_such_as_rate_is_refused_up_front(tmp_path: Path):
    root = tmp_path / "live"
    (root / "offsets").mkdir(parents=True)
    # What Spark's rate source writes: a bare counter (LongOffset), next to a file source.
    (root / "offsets" / "4").write_text(
        'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1}\n{"logOffset":4}\n17')
    with pytest.raises(ConfigError) as caught:
        follow._check_followable(snapshot_at(root, 4))
    message = str(caught.value)
    assert "source 1 of batch 4 has a counter offset (17)" in message and "rate" in message, message
    assert "stop-savepoint-start" in message


def test_file_and_structured_sources_can_be_followed(tmp_path: Path):
    root = live(tmp_path, 3)
    follow._check_followable(snapshot_at(root, 2))  # no error
    (root / "offsets" / "2").write_text('v1\n{}\n{"topic":{"0":12}}')
    follow._check_followable(snapshot_at(root, 2))


def test_blue_without_a_checkpoint_or_a_foreign_start_is_refused(tmp_path: Path):
    blue = follow.BlueJob(Catalog(LocalStorage(str(tmp_path / "blue")), "orders"), ReplayRecordSink({}))
    with pytest.raises(ConfigError,
                       match=r"shadow\.from=latest: job 'orders' .* has no completed checkpoint"):
        blue.warmup_point("latest")
    with pytest.raises(ConfigError,
                       match=r"shadow\.from='file:///elsewhere/chk-3' is not a completed checkpoint"):
        blue.warmup_point("file:///elsewhere/chk-3")


# -- blue's records -------------------------------------------------------------------------


def test_blue_records_come_from_its_sink_else_from_its_newest_pending_transaction(tmp_path: Path):
    root = live(tmp_path, 4)
    records = {b: replay.capture(str(root), b) for b in range(4)}
    catalog = Catalog(LocalStorage(str(tmp_path / "blue")), "orders")
    sink = ReplayRecordSink({0: records[0], 1: records[1]})
    blue = follow.BlueJob(catalog, sink)
    pending(catalog, 2, 1, replay.capture(str(root), 3))  # an older generation's staging of batch 2
    pending(catalog, 2, 2, records[2])
    body, committed = blue.record(1) or ({}, None)
    assert (body["batch"], committed) == (1, True)
    body, committed = blue.record(2) or ({}, None)
    assert (body["batch"], body["offsets"], committed) == (2, (root / "offsets" / "2").read_text(), False)
    assert blue.record(3) is None  # blue has not staged it yet


def test_a_record_without_replay_or_of_another_batch_is_an_error(tmp_path: Path):
    root = live(tmp_path, 3)
    catalog = Catalog(LocalStorage(str(tmp_path / "blue")), "orders")
    pending(catalog, 1, 1, None)
    blue = follow.BlueJob(catalog, ReplayRecordSink({2: replay.capture(str(root), 1)}))
    with pytest.raises(SparkpointError, match=r"carries no replay record"):
        blue.record(1)
    with pytest.raises(SparkpointError, match=r"blue's commit of batch 2 .* names batch 1, not 2"):
        blue.record(2)
    (tmp_path / "blue" / "orders" / layout.txn_key(5, 1)).write_text("{not json")
    with pytest.raises(SparkpointError, match=r"pending transaction of batch 5 is unreadable"):
        blue.record(5)


def test_the_transaction_log_reads_one_record_by_key(tmp_path: Path):
    catalog = Catalog(LocalStorage(str(tmp_path / "blue")), "orders")
    assert catalog.transaction_log.get(3, 1) is None
    pending(catalog, 3, 1, "0:none")
    record = catalog.transaction_log.get(3, 1)
    assert record is not None and (record.batch_id, record.generation) == (3, 1)
    (tmp_path / "blue" / "orders" / layout.txn_key(4, 1)).write_text(
        json.dumps({**record.to_json(), "batch_id": 9}))
    with pytest.raises(CorruptRecord, match=r"describes batch 9"):
        catalog.transaction_log.get(4, 1)


# -- the shadow sink and the progress record -------------------------------------------------


def test_the_shadow_sink_keeps_nothing_and_is_rebuilt_from_its_config(tmp_path: Path):
    sink = ShadowSink("compare", str(tmp_path))
    rebuilt = sink_from_config("shadow", sink.to_config())
    assert isinstance(rebuilt, ShadowSink) and (rebuilt.mode, rebuilt.dir) == ("compare", str(tmp_path))
    assert sink.batch_dir("orders-shadow", 7) == str(tmp_path / "orders-shadow" / "batch-7")
    assert sink.committed_position("orders-shadow") is None
    with pytest.raises(ConfigError, match=r"mode='compare' needs dir"):
        ShadowSink("compare")
    with pytest.raises(ConfigError, match=r"mode='publish' is not allowed"):
        ShadowSink("publish")
    with pytest.raises(ConfigError, match=r"discard mode stages no rows"):
        ShadowSink().batch_dir("orders-shadow", 1)


def test_the_progress_record_round_trips_and_says_how_far_behind(tmp_path: Path):
    store = LocalStorage(str(tmp_path))
    assert read_follow(store) is None
    progress = FollowProgress(shadow_job="orders-shadow", blue_job="orders", mode="compare",
                              state="following",
                              started_from="file:///sp/orders/chk-4", started_batch=4, last_replayed=6,
                              blue_last_batch=9, seconds_per_batch=0.8, verified_through=6,
                              difference="x" * 100_000)
    write_follow(store, progress)
    back = read_follow(store)
    assert back is not None and back.behind == 3 and back.seconds_per_batch == 0.8
    assert len(back.difference or "") < 20_000  # clipped
    assert json.loads((tmp_path / "follow.json").read_text())["behind"] == 3
    (tmp_path / "follow.json").write_text(json.dumps({**progress.to_json(), "state": "adopting",
                                                      "difference": None}))
    with pytest.raises(CorruptRecord):
        read_follow(store)
