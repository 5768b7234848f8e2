"""Assets of Sparkpoint jobs: the URI rule (`airflow_sparkpoint.assets`), the commit head
the transaction service writes, and the watchers' event triggers polling a real local
catalog (records settled by the real commit step, savepoints made by the real catalog).

Airflow is imported inside the tests only, after the ``airflow_home`` fixture set it up."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.commit_head import read_commit_head
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.commit import commit_pending
from airflow_sparkpoint.sinks import DeltaSink, DirectorySink, S3Sink
from tests.support.fake_sinks import FakeSink, VersionedSink
from tests.support.records import confirm, put_checkpoint, transaction_record

pytestmark = pytest.mark.airflow

JOB = "orders"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


# ---------------------------------------------------------------------------- the URI rule


@pytest.mark.parametrize(("sink", "uri"), [
    (DeltaSink("/data/tables/orders"), "file:///data/tables/orders"),
    (DeltaSink("file:///data/tables/my%20orders"), "file:///data/tables/my%20orders"),
    (DeltaSink("s3://lake-bucket/tables/orders/"), "s3://lake-bucket/tables/orders"),
    (DeltaSink("s3a://lake-bucket/tables/orders"), "s3://lake-bucket/tables/orders"),
    (S3Sink("s3://lake-bucket/out/"), "s3://lake-bucket/out"),
    (DirectorySink("/data/out/"), "file:///data/out"),
    ({"kind": "delta", "uri": "s3://lake-bucket/t", "mode": "merge", "keys": ["id"]}, "s3://lake-bucket/t"),
    ({"kind": "directory", "uri": "s3://lake-bucket/d", "format": "json"}, "s3://lake-bucket/d"),
])
def test_a_sinks_asset_is_named_after_its_location_and_airflow_keeps_the_uri(sink: Any, uri: str) -> None:
    from airflow_sparkpoint import assets

    assert assets.sink_asset_uri(sink) == uri
    asset = assets.sink_asset(sink)
    assert (asset.name, asset.uri) == (uri, uri)  # Airflow's sanitizer left it as it is


def test_savepoint_assets_by_connection_or_by_storage_root(tmp_path: Path) -> None:
    from airflow_sparkpoint import assets

    by_conn = assets.savepoints_asset("orders", sparkpoint_conn_id="sparkpoint_default")
    assert by_conn.uri == "sparkpoint://sparkpoint_default/orders/savepoints"
    assert assets.savepoints_asset_uri("orders", checkpoint_dir=str(tmp_path / "sp") + "/") == \
        f"{(tmp_path / 'sp').as_uri()}/orders/savepoints"
    assert assets.savepoints_asset_uri("orders", checkpoint_dir="s3://sp-bucket/root/") == \
        "s3://sp-bucket/root/orders/savepoints"
    with pytest.raises(ConfigError, match="sparkpoint_conn_id or checkpoint_dir"):
        assets.savepoints_asset_uri("orders")
    with pytest.raises(ConfigError, match="'bad/job'"):
        assets.savepoints_asset_uri("bad/job", sparkpoint_conn_id="c")


def test_a_sink_without_a_location_or_no_sink_has_no_asset() -> None:
    from airflow_sparkpoint import assets

    with pytest.raises(NotImplementedError, match="FakeSink names no location"):
        assets.sink_asset_uri(FakeSink("w-none"))
    with pytest.raises(ConfigError, match="sink=None"):
        assets.sink_asset_uri(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------- the commit head


@pytest.fixture()
def sink(tmp_path: Path) -> VersionedSink:
    return VersionedSink(f"w-{tmp_path.name}")


def test_the_head_moves_for_committed_batches_only_and_not_again_for_a_repeated_step(
    catalog: Catalog, sink: VersionedSink
) -> None:
    catalog.claim_generation()
    assert read_commit_head(catalog) is None
    confirm(catalog, transaction_record(sink, 0, job=JOB), transaction_record(sink, 1, job=JOB))
    catalog.put_transaction(transaction_record(sink, 2, job=JOB))  # staged, never confirmed
    commit_pending(catalog, sink=sink)
    head = read_commit_head(catalog)
    assert head is not None and (head.seq, head.batch, head.sink_version) == (2, 1, 101), head
    assert head.txn_id == f"{JOB}-b1-g1" and head.sink_id == sink.sink_id

    # The staged batch 2 is aborted once a checkpoint past it exists: the head stays.
    confirm(catalog, transaction_record(sink, 3, job=JOB))
    outcome = commit_pending(catalog, sink=sink)
    assert outcome["aborted"] == [f"{JOB}-b2-g1"] and outcome["committed"] == [f"{JOB}-b3-g1"], outcome
    head = read_commit_head(catalog)
    assert head is not None and (head.seq, head.batch) == (3, 3), head

    # A step killed after the sink commit and before the record's deletion: the repeated
    # step finds it "already" landed and does not report it again.
    catalog.put_transaction(transaction_record(sink, 3, job=JOB))
    assert commit_pending(catalog, sink=sink)["already"] == [f"{JOB}-b3-g1"]
    head = read_commit_head(catalog)
    assert head is not None and head.seq == 3, head


def test_an_unreadable_or_oversized_head_is_replaced_by_the_next_commit(
    catalog: Catalog, sink: VersionedSink, monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_sparkpoint.checkpoints import layout

    catalog.claim_generation()
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.COMMITTED, 1024)
    catalog.store.put(layout.COMMITTED, b"{" + b" " * 4096 + b"}")  # planted: over the limit
    assert read_commit_head(catalog) is None
    confirm(catalog, transaction_record(sink, 0, job=JOB))
    commit_pending(catalog, sink=sink)
    head = read_commit_head(catalog)
    assert head is not None and (head.seq, head.batch) == (1, 0), head
    catalog.store.put(layout.COMMITTED, b"not json")
    assert read_commit_head(catalog) is None
    confirm(catalog, transaction_record(sink, 1, job=JOB))
    commit_pending(catalog, sink=sink)
    head = read_commit_head(catalog)
    assert head is not None and (head.seq, head.batch) == (1, 1), head


# ---------------------------------------------------------------------------- the watchers


class StateStore:
    """What Airflow's asset state store offers a watcher trigger (``aget``/``aset``), kept
    in a dict that outlives a trigger, as the metadata database outlives a triggerer."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self.sets = 0

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.sets += 1
        self.values[key] = value


class Watch:
    """A watcher trigger run as the triggerer runs it, in steps: `next` waits for its next
    event, `quiet` lets it poll three more times and checks that it yielded nothing, and
    `stop` ends it as a triggerer shutdown does."""

    def __init__(self, cls: type, root: str, state: StateStore | None) -> None:
        self.trigger = cls(job_name=JOB, checkpoint_dir=root, poll_interval=0.02)
        self.trigger.asset_state_store = state
        self.polls = 0
        position = self.trigger.position

        def counted(*args: Any) -> Any:
            self.polls += 1
            return position(*args)

        self.trigger.position = counted
        self.events = self.trigger.run()
        self.pending: asyncio.Future[Any] | None = None

    def _pending(self) -> asyncio.Future[Any]:
        if self.pending is None:
            self.pending = asyncio.ensure_future(self.events.__anext__())
        return self.pending

    async def next(self) -> Mapping[str, Any]:
        event = await asyncio.wait_for(asyncio.shield(self._pending()), timeout=60)
        self.pending = None
        return event.payload  # type: ignore[no-any-return]

    async def quiet(self) -> None:
        pending = self._pending()
        target = self.polls + 3
        while self.polls < target and not pending.done():
            await asyncio.sleep(0.01)
        assert not pending.done(), f"unexpected event: {pending.result()}"

    async def stop(self) -> None:
        if self.pending is not None:
            self.pending.cancel()
            try:
                await self.pending
            except (asyncio.CancelledError, StopAsyncIteration):
                pass
        await self.events.aclose()
        await self.trigger.cleanup()


def test_the_commit_watcher_reports_new_commits_never_staged_ones_and_resumes_after_a_restart(
    catalog: Catalog, root: str, sink: VersionedSink
) -> None:
    from airflow_sparkpoint.triggers.assets import SparkpointCommitTrigger

    catalog.claim_generation()
    confirm(catalog, transaction_record(sink, 0, job=JOB))
    commit_pending(catalog, sink=sink)  # history before the watcher: not reported
    state = StateStore()

    async def scenario() -> list[Mapping[str, Any]]:
        seen = []
        first = Watch(SparkpointCommitTrigger, root, state)
        await first.quiet()
        key = first.trigger.cursor_key
        assert state.values[key]["seq"] == 1 and state.values[key]["batch"] == 0, state.values

        confirm(catalog, transaction_record(sink, 1, job=JOB), transaction_record(sink, 2, job=JOB))
        commit_pending(catalog, sink=sink)
        seen.append(await first.next())
        catalog.put_transaction(transaction_record(sink, 3, job=JOB))  # staged only
        await first.quiet()
        assert state.values[key]["batch"] == 2  # saved one poll after the event
        await first.stop()

        # A new triggerer takes the watcher over: nothing is reported twice, the next
        # commit is.
        second = Watch(SparkpointCommitTrigger, root, state)
        await second.quiet()
        confirm(catalog, transaction_record(sink, 3, job=JOB))
        commit_pending(catalog, sink=sink)
        seen.append(await second.next())
        # The triggerer dies right after handing the event over (its cursor is not saved
        # yet): the next one reports it again, with the same seq for the consumer to dedupe.
        await second.stop()
        third = Watch(SparkpointCommitTrigger, root, state)
        seen.append(await third.next())
        await third.quiet()
        await third.stop()
        return seen

    seen = asyncio.run(scenario())
    assert [(e["after_batch"], e["last_batch"], e["seq"], e["sink_version"]) for e in seen] == \
        [(0, 2, 3, 102), (2, 3, 4, 103), (2, 3, 4, 103)], seen
    assert all(e["job"] == JOB and e["generation"] == 1 and e["kind"] == "commit" for e in seen), seen


def test_the_savepoint_watcher_reports_each_completed_savepoint_once(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint.triggers.assets import SparkpointSavepointTrigger

    catalog.claim_generation()
    old = put_checkpoint(catalog, generation=1)
    catalog.create_savepoint(catalog.handle(old), generation=1)  # before the watcher
    state = StateStore()

    async def scenario() -> list[Mapping[str, Any]]:
        watch = Watch(SparkpointSavepointTrigger, root, state)
        await watch.quiet()
        newer = put_checkpoint(catalog, generation=1)
        handle = catalog.create_savepoint(catalog.handle(newer), generation=1)
        seen = [await watch.next()]
        await watch.quiet()
        await watch.stop()
        assert seen[0]["savepoint"] == handle.uri
        return seen

    [event] = asyncio.run(scenario())
    assert event["job"] == JOB and event["generation"] == 1 and event["kind"] == "savepoint", event


def test_without_an_asset_state_store_the_cursor_is_in_memory(catalog: Catalog, root: str,
                                                              sink: VersionedSink) -> None:
    from airflow_sparkpoint.triggers.assets import SparkpointCommitTrigger

    catalog.claim_generation()

    async def scenario() -> Mapping[str, Any]:
        watch = Watch(SparkpointCommitTrigger, root, None)
        await watch.quiet()
        confirm(catalog, transaction_record(sink, 0, job=JOB))
        commit_pending(catalog, sink=sink)
        event = await watch.next()
        await watch.stop()
        return event

    event = asyncio.run(scenario())
    assert (event["after_batch"], event["last_batch"], event["seq"]) == (None, 0, 1), event


def test_watchers_validate_their_arguments_and_serialize_to_their_class_path(root: str) -> None:
    from airflow_sparkpoint.triggers.assets import SparkpointCommitTrigger, SparkpointSavepointTrigger

    # no storage named: the default connection, as every operator, sensor and trigger
    assert SparkpointCommitTrigger(job_name=JOB).sparkpoint_conn_id == "sparkpoint_default"
    assert SparkpointCommitTrigger(job_name=JOB, checkpoint_dir=root).sparkpoint_conn_id is None
    with pytest.raises(ConfigError, match="poll_interval"):
        SparkpointCommitTrigger(job_name=JOB, checkpoint_dir=root, poll_interval=0)
    path, kwargs = SparkpointSavepointTrigger(job_name=JOB, sparkpoint_conn_id="sp").serialize()
    assert path == "airflow_sparkpoint.triggers.assets.SparkpointSavepointTrigger"
    assert SparkpointSavepointTrigger(**kwargs).serialize() == (path, kwargs)


# ---------------------------------------------------------------------------- consumers


def test_the_example_savepoint_dag_takes_the_savepoint_of_an_operators_event_as_of_a_watchers() -> None:
    """``example_sparkpoint_scheduled_savepoints`` takes savepoints of the job that
    ``example_sparkpoint_on_savepoint`` watches, on the same asset: its operator's event
    (the savepoint at the top of ``extra``) can trigger a run alone, as the watcher's
    (under ``extra["payload"]``) can."""
    import runpy

    from airflow_sparkpoint.assets import savepoint_extra

    dags = Path(__file__).resolve().parents[3] / "dags"
    example = runpy.run_path(str(dags / "example_sparkpoint_assets.py"))
    newest = example["on_savepoint"].task_dict["newest_savepoint"].python_callable

    class Event:
        def __init__(self, extra: dict[str, Any]) -> None:
            self.extra = extra

    operator = Event(savepoint_extra(job="sensor_alerts", generation=3,
                                     savepoint_uri="file:///sp/savepoint-7-a",
                                     batch_id=9, source="savepoint"))
    watcher = Event({"from_trigger": True, "payload": {
        "kind": "savepoint", "job": "sensor_alerts", "generation": 3, "batch": 9, "checkpoint_id": 7,
        "savepoint": "file:///sp/savepoint-7-a", "created_at": 1.0}})
    assert newest(triggering_asset_events={"a": [operator]}) == "file:///sp/savepoint-7-a"
    assert newest(triggering_asset_events={"a": [watcher, operator]}) == "file:///sp/savepoint-7-a"
    assert newest(triggering_asset_events={"a": [operator, watcher]}) == "file:///sp/savepoint-7-a"


# ------------------------------------------------ the savepoint watcher's reads per poll


def _savepoint_poll(catalog: Catalog, cursor: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str]]:
    """One look of the savepoint watcher at `catalog`: the position, and the ``_metadata``
    of which savepoints it read."""
    from airflow_sparkpoint.storage.counting import CountingStorage
    from airflow_sparkpoint.triggers.assets import SparkpointSavepointTrigger

    counting = CountingStorage(catalog.storage)
    position = SparkpointSavepointTrigger(job_name=JOB, checkpoint_dir="unused").position(
        Catalog(counting, catalog.job), dict(cursor) if cursor is not None else None)
    return (position,
            [key.split("/")[-2] for op, key in counting.log if op == "get" and key.endswith("/_metadata")])


def test_a_savepoint_directory_without_metadata_does_not_make_every_poll_read_every_savepoint(
    catalog: Catalog,
) -> None:
    """A savepoint being copied, or one whose copy died: each poll reads that one directory
    again (it may complete), never the metadata of the savepoints already seen."""
    from airflow_sparkpoint.triggers.assets import SparkpointSavepointTrigger

    catalog.claim_generation()
    for _ in range(6):
        catalog.create_savepoint(catalog.handle(put_checkpoint(catalog, generation=1)), generation=1)
    catalog.store.put("savepoints/savepoint-99-unfinished/files/offsets/0", b"half a copy")
    watcher = SparkpointSavepointTrigger(job_name=JOB, checkpoint_dir="unused")
    start, _ = _savepoint_poll(catalog, None)
    cursor = watcher.cursor_of(start)

    position, read = _savepoint_poll(catalog, cursor)
    assert read == ["savepoint-99-unfinished"], read
    assert watcher.events(cursor, position) == []

    newer = catalog.create_savepoint(catalog.handle(put_checkpoint(catalog, generation=1)), generation=1)
    position, read = _savepoint_poll(catalog, cursor)
    assert sorted(read) == sorted(["savepoint-99-unfinished", newer.uri.rsplit("/", 1)[-1]]), read
    assert [e["savepoint"] for e in watcher.events(cursor, position)] == [newer.uri]


def test_more_savepoints_than_the_cursor_keeps_are_not_read_again_at_every_poll(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the names a cursor keeps (retention off: one savepoint every 10 minutes is 144
    a day), a poll reads no savepoint it has seen, and a new one is still reported; an idle
    job's savepoints (all of one checkpoint) too."""
    from airflow_sparkpoint.services import watches
    from airflow_sparkpoint.triggers import assets

    monkeypatch.setattr(watches, "MAX_KNOWN_SAVEPOINTS", 4)
    watcher = assets.SparkpointSavepointTrigger(job_name=JOB, checkpoint_dir="unused")
    catalog.claim_generation()
    for _ in range(7):
        catalog.create_savepoint(catalog.handle(put_checkpoint(catalog, generation=1)), generation=1)
    idle = put_checkpoint(catalog, generation=1)
    for _ in range(6):  # no new batch between them: every one of checkpoint `idle`
        catalog.create_savepoint(catalog.handle(idle), generation=1)
    start, _ = _savepoint_poll(catalog, None)
    cursor = watcher.cursor_of(start)

    position, read = _savepoint_poll(catalog, cursor)
    assert read == [], read
    assert watcher.events(cursor, position) == []

    for source in (idle, put_checkpoint(catalog, generation=1)):
        made = catalog.create_savepoint(catalog.handle(source), generation=1)
        position, read = _savepoint_poll(catalog, cursor)
        assert read == [made.uri.rsplit("/", 1)[-1]], read
        assert [e["savepoint"] for e in watcher.events(cursor, position)] == [made.uri]
        cursor = watcher.cursor_of(position)


def test_a_cursor_of_the_previous_release_does_not_announce_old_savepoints_again(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous release's cursor kept the newest `MAX_KNOWN_SAVEPOINTS` names and no
    floor: after the upgrade, the older savepoints it had stopped naming are not new."""
    from airflow_sparkpoint.services import watches
    from airflow_sparkpoint.triggers import assets

    monkeypatch.setattr(watches, "MAX_KNOWN_SAVEPOINTS", 4)
    watcher = assets.SparkpointSavepointTrigger(job_name=JOB, checkpoint_dir="unused")
    catalog.claim_generation()
    made = [catalog.create_savepoint(catalog.handle(put_checkpoint(catalog, generation=1)), generation=1)
            for _ in range(7)]
    old_cursor = {"known": [handle.uri.rsplit("/", 1)[-1] for handle in made[-4:]]}

    position, _ = _savepoint_poll(catalog, old_cursor)
    assert watcher.events(old_cursor, position) == []
    newer = catalog.create_savepoint(catalog.handle(put_checkpoint(catalog, generation=1)), generation=1)
    position, _ = _savepoint_poll(catalog, old_cursor)
    assert [e["savepoint"] for e in watcher.events(old_cursor, position)] == [newer.uri]
