"""The operators' asset events under `dag.test()`: an event of the output asset exactly
when the commit step made batches visible (its extra: job, generation, batches, sink
version), none for a step that only aborted or found nothing; a savepoint asset event
per savepoint (its URI in the extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError
from tests.support.dag_runs import new_dag, run_dag, task_state
from tests.support.fake_sinks import LocatedSink
from tests.support.records import confirm, put_checkpoint, transaction_record

pytestmark = pytest.mark.airflow

JOB = "orders"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def asset_events(uri: str) -> list[dict[str, Any]]:
    """The extra of every asset event of `uri` in the metadata database, oldest first."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(select(AssetEvent).join(AssetModel, AssetEvent.asset_id == AssetModel.id)
                               .where(AssetModel.uri == uri).order_by(AssetEvent.id))
        return [dict(row.extra) for row in rows]


def test_the_commit_step_emits_one_event_when_it_committed_and_none_when_it_did_not(
    catalog: Catalog, root: str, tmp_path: Path
) -> None:
    from airflow_sparkpoint import assets
    from airflow_sparkpoint.operators import SparkpointCommitOperator

    sink = LocatedSink(f"w-{tmp_path.name}")
    catalog.claim_generation()
    confirm(catalog, transaction_record(sink, 0, job=JOB), transaction_record(sink, 1, job=JOB))
    catalog.put_transaction(transaction_record(sink, 2, job=JOB))  # staged, not confirmed

    def step() -> Any:
        with new_dag("commit_assets") as dag:
            SparkpointCommitOperator(task_id="commit", job_name=JOB, checkpoint_dir=root, sink=sink)
        run = run_dag(dag)
        assert task_state(run, "commit") == "success"

    step()
    uri = assets.sink_asset_uri(sink)
    assert asset_events(uri) == [{"job": JOB, "generation": 1, "committed_batches": [0, 1], "last_batch": 1,
                                  "sink": sink.sink_id, "sink_version": 101, "source": "commit"}]
    step()  # nothing new: batch 2 is still unconfirmed
    assert len(asset_events(uri)) == 1

    # batch 2 can never be confirmed now: aborted; batch 3 committed
    confirm(catalog, transaction_record(sink, 3, job=JOB))
    step()
    events = asset_events(uri)
    assert (len(events) == 2 and events[-1]["committed_batches"] == [3]
            and events[-1]["sink_version"] == 103), events
    assert sink.world["aborted"] == [f"{JOB}-b2-g1"]


def test_a_savepoint_emits_an_event_of_the_jobs_savepoints_asset(catalog: Catalog, root: str) -> None:
    from airflow_sparkpoint import assets
    from airflow_sparkpoint.operators import SparkpointSavepointOperator

    catalog.claim_generation()
    checkpoint = put_checkpoint(catalog, generation=1)
    with new_dag("savepoint_assets") as dag:
        SparkpointSavepointOperator(task_id="savepoint", job_name=JOB, checkpoint_dir=root, deferrable=False)
    run = run_dag(dag)
    assert task_state(run, "savepoint") == "success"
    [savepoint] = [e for e in catalog.list_savepoints() if e.valid]
    events = asset_events(assets.savepoints_asset_uri(JOB, checkpoint_dir=root))
    assert events == [{"job": JOB, "generation": 1, "savepoint": savepoint.uri, "batch": checkpoint.batch_id,
                       "source": "savepoint"}], events


def test_the_operators_declare_their_alias_outlet_and_a_drill_declares_none(root: str) -> None:
    from airflow.sdk import AssetAlias

    from airflow_sparkpoint.operators import (
        SparkpointCommitOperator,
        SparkpointSubmitOperator,
        SparkpointVerifyOperator,
    )

    with new_dag("outlets") as dag:
        submit = SparkpointSubmitOperator(task_id="submit", application="job.py", job_name=JOB,
                                          checkpoint_dir=root,
                                          sink={"kind": "delta", "uri": "s3://lake-bucket/t"})
        quiet = SparkpointCommitOperator(task_id="quiet", job_name=JOB, checkpoint_dir=root,
                                         emit_asset_events=False)
        drill = SparkpointVerifyOperator(task_id="drill", application="job.py", job_name=JOB,
                                         checkpoint_dir=root, output_args={"--output": "{scratch}/out"})
    assert submit.outlets == [AssetAlias(f"sparkpoint:{dag.dag_id}.submit")]
    assert quiet.outlets == [] and drill.outlets == [] and drill.declared_output() is None
    with pytest.raises(ConfigError, match="sets sink itself"):
        SparkpointVerifyOperator(task_id="x", application="job.py", job_name=JOB, checkpoint_dir=root,
                                 output_args={"--output": "{scratch}/out"},
                                 sink={"kind": "delta", "uri": "/t"})
