"""`SparkpointSubmitOperator`'s asset event (spark-submit replaced by the stand-in of
`tests.support.fake_submit`, which does to the catalog what a driver does): one event of the
declared sink's asset naming the batches the run committed and the sink version from the
commit head; none for a run that committed nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.sinks.transactions import settle_all
from tests.support.fake_sinks import LocatedSink
from tests.support.fake_submit import JOB, Driver, driver, operator  # noqa: F401 - the fixture
from tests.support.records import confirm, transaction_record
from tests.support.task_instances import FakeTI

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", json.dumps({"conn_type": "spark", "host": "local[2]"}))


def events_of(op: Any) -> list[Any]:
    from airflow.sdk.execution_time.context import OutletEventAccessors

    events = OutletEventAccessors()
    op.execute({"ti": FakeTI(), "outlet_events": events})
    return list(events[op.assets_alias].asset_alias_events)


def test_a_run_that_committed_emits_one_event_and_one_that_did_not_emits_none(tmp_path: Path,
                                                                              driver: Driver) -> None:  # noqa: F811
    from airflow_sparkpoint import assets

    sink = LocatedSink(f"w-{tmp_path.name}")

    def commits_two(d: Driver, env: dict[str, str]) -> int:
        generation = d.claim(env)
        records = [transaction_record(sink, 0, generation, job=JOB),
                   transaction_record(sink, 1, generation, job=JOB)]
        confirm(d.catalog, *records)
        settle_all(d.catalog, records, lambda _r: sink, confirmed=True, fence=Fence(d.catalog, generation))
        d.result(generation, committed_batches=(0, 1), last_batch=1)
        return 0

    driver.behaviour = commits_two
    [event] = events_of(operator(tmp_path / "sp", sink=sink))
    assert event.dest_asset_key.uri == assets.sink_asset_uri(sink)
    assert event.extra == {"job": "orders", "generation": 1, "committed_batches": [0, 1], "last_batch": 1,
                           "sink": sink.sink_id, "sink_version": 101, "source": "submit"}

    driver.behaviour = Driver.finish  # a run that committed nothing (e.g. commit.mode=external)
    assert events_of(operator(tmp_path / "sp", sink=sink)) == []
