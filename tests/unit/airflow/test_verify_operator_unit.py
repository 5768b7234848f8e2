"""`SparkpointVerifyOperator` without Spark: argument validation, the output-argument
rewrite, and that everything it acts on (its storage, job name, catalog) is the
drill's, never the production job's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import open_storage

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def operator(tmp_path: Path, **overrides: Any) -> Any:
    from airflow_sparkpoint.operators import SparkpointVerifyOperator

    kwargs: dict[str, Any] = {
        "task_id": "drill", "job_name": "alerts", "checkpoint_dir": str(tmp_path / "prod"),
        "application": "job.py",
        "application_args": ["--input", "/in", "--output", "/prod/out", "--limit", "9"],
        "output_args": {"--output": "{scratch}/out"}, "drill_dir": str(tmp_path / "drills"),
    }
    kwargs.update(overrides)
    return SparkpointVerifyOperator(**kwargs)


@pytest.mark.parametrize(("overrides", "message"), [
    ({"output_args": {}}, "needs output_args"),
    ({"restore": "latest"}, "sets restore itself"),
    ({"trigger": "processingTime:1s"}, "sets trigger itself"),
    ({"commit_mode": "external"}, "sets commit_mode itself"),
])
def test_constructor_refuses_what_would_make_it_not_a_drill(tmp_path, overrides, message):
    with pytest.raises(ConfigError, match=message):
        operator(tmp_path, **overrides)


def test_output_arguments_point_at_the_drill_directory(tmp_path):
    op = operator(tmp_path, application_args=["--input", "/in", "--output", "/prod/out", "--report=/prod/r"],
                  output_args={"output": "{scratch}/out", "--report": "/scratch/report"})
    op._prepare_scratch()
    root = op._drill_root
    assert root.startswith(str(tmp_path / "drills") + "/drill-") and Path(root).is_dir()
    assert op._drill_arguments() == ["--input", "/in", "--output", f"{root}/out", "--report=/scratch/report"]
    assert op._drill_work == f"{root}/live"  # no work_dir: the drill's own directory
    op._remove_scratch()
    assert not Path(root).exists()


def test_an_output_argument_the_application_does_not_take_is_refused(tmp_path):
    op = operator(tmp_path, output_args={"--out": "{scratch}/x"})
    op._prepare_scratch()
    with pytest.raises(ConfigError, match="'--out', which is not among application_args"):
        op._drill_arguments()


def test_drill_identity_conf_and_on_kill_target_the_drill_not_production(tmp_path):
    op = operator(tmp_path, stop_timeout=0.1, work_dir=str(tmp_path / "production-live"))
    production = Catalog(open_storage(str(tmp_path / "prod")), "alerts")
    production.claim_generation()
    op._prepare_scratch()
    op._snapshot_uri = f"{production.uri}/savepoints/savepoint-3-abc"
    conf = op.build_sparkpoint_conf(op.choose_restore(try_number=2))
    assert conf["spark.sparkpoint.job"] == "alerts-drill"
    assert conf["spark.sparkpoint.dir"] == op._drill_root
    assert conf["spark.sparkpoint.restore"] == op._snapshot_uri, "every try restores the drilled snapshot"
    assert conf["spark.sparkpoint.restore.allowForeignJob"] == "true"
    assert conf["spark.sparkpoint.trigger"] == "availableNow"
    # under the shared work_dir every executor sees (a worker's tmp would be refused on a
    # cluster), in the drill's own directory: never the production job's live location
    drill_id = op._drill_root.rsplit("/", 1)[1]
    assert conf["spark.sparkpoint.workDir"] == f"{tmp_path / 'production-live'}/sparkpoint-drills/{drill_id}"
    drill_catalog = op._catalog()
    assert (drill_catalog.job == "alerts-drill"
            and drill_catalog.uri.endswith(f"{op._drill_root}/alerts-drill"))

    op.on_kill()  # no spark-submit runs: nothing to signal, and nothing may reach production
    assert ControlChannel(production).request_ids() == [], \
        "on_kill of a drill must never stop the production job"
    assert production.current_generation() == 1


def test_drill_job_must_differ_from_the_production_job(tmp_path):
    op = operator(tmp_path, drill_job="alerts")
    with pytest.raises(ConfigError, match="production job's name"):
        op.execute({"ti": None})


def _result(batch: int, first: int, rescaled: dict[str, int] | None = None) -> dict[str, Any]:
    """A run result as `SparkpointJob.run` reports it after restoring the savepoint of `batch`."""
    return {"status": "finished", "restore_mode": "snapshot",
            "restored_from": "s3://b/sp/alerts/savepoints/sp-7",
            "first_batch": first, "last_batch": first + 1, "batches_processed": 2, "generation": 1,
            "rescaled": rescaled or {}}


def test_a_rescaled_drill_starts_after_the_repartitioners_batch(tmp_path):
    """state_partitions=N: Spark's repartitioner commits batch N+1 without input, so the
    run's first batch is N+2 exactly when the result says it rescaled at N+1; without a
    rescale (or a rescale at another batch) N+2 still means batches were skipped."""
    from types import SimpleNamespace

    from airflow_sparkpoint.operators.verify import DrillFailed

    op = operator(tmp_path, state_partitions=3)
    handle = SimpleNamespace(uri="s3://b/sp/alerts/savepoints/sp-7", metadata=SimpleNamespace(batch_id=7))
    checks = op._check_result(_result(7, 9, {"from": 2, "to": 3, "batch": 8}), handle)
    assert checks["first_batch"] == 9 and checks["rescaled"] == {"from": 2, "to": 3, "batch": 8}
    assert op._check_result(_result(7, 8), handle)["first_batch"] == 8  # no rescale: right after the snapshot
    for first, rescaled in ((9, None), (9, {"from": 2, "to": 3, "batch": 9}),
                            (10, {"from": 2, "to": 3, "batch": 8}), (8, {"from": 2, "to": 3, "batch": 8})):
        with pytest.raises(DrillFailed, match=f"first batch was {first}, expected"):
            op._check_result(_result(7, first, rescaled), handle)


def test_the_drill_operator_has_a_name_that_says_so_and_the_old_name_works() -> None:
    """`sparkpoint verify` restores state without the application; the operator runs the
    application (a drill): SparkpointDrillOperator, with SparkpointVerifyOperator kept."""
    from airflow_sparkpoint import operators
    from airflow_sparkpoint.operators import SparkpointDrillOperator, SparkpointVerifyOperator

    assert issubclass(SparkpointVerifyOperator, SparkpointDrillOperator)
    assert {"SparkpointDrillOperator", "SparkpointVerifyOperator"} <= set(operators.__all__)
    for cls in (SparkpointDrillOperator, SparkpointVerifyOperator):
        with pytest.raises(ConfigError, match=f"{cls.__name__} needs output_args"):
            cls(task_id="d", job_name="orders", checkpoint_dir="/x", application="/app.py", output_args={})


def test_drill_failed_of_the_operators_is_the_error_tree_s() -> None:
    """The drill operators' `DrillFailed` is `exceptions.DrillFailed` (issue 47), the same class."""
    from airflow_sparkpoint import exceptions
    from airflow_sparkpoint.operators.verify import DrillFailed

    assert DrillFailed is exceptions.DrillFailed
