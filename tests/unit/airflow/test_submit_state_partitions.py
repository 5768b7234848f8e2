"""``state_partitions`` on `SparkpointSubmitOperator`: validated at construction, passed
as ``spark.sparkpoint.restore.statePartitions`` on every try, and refused when the
submit's own ``spark.sql.shuffle.partitions`` says otherwise (before anything is submitted)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sparkpoint.exceptions import ConfigError

pytestmark = pytest.mark.airflow

KEY = "spark.sparkpoint.restore.statePartitions"


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> Iterator[None]:
    yield


def operator(tmp_path: Path, **kwargs: object) -> object:
    from airflow_sparkpoint.operators import SparkpointSubmitOperator

    return SparkpointSubmitOperator(task_id="t", application="job.py", job_name="orders",
                                    checkpoint_dir=str(tmp_path / "sp"), **kwargs)


@pytest.mark.parametrize("value", [0, -1, "8", 2.5, True])
def test_bad_state_partitions_are_refused_at_construction(tmp_path: Path, value: object) -> None:
    with pytest.raises(ConfigError,
                       match=rf"state_partitions={value!r} is invalid; expected an integer >= 1"):
        operator(tmp_path, state_partitions=value)


def test_state_partitions_reach_the_job_on_every_try(tmp_path: Path) -> None:
    op = operator(tmp_path, state_partitions=8)
    for restore in ("/some/savepoint", "latest"):  # first try, retry
        assert op.build_sparkpoint_conf(restore)[KEY] == "8"  # type: ignore[attr-defined]
    assert KEY not in operator(tmp_path).build_sparkpoint_conf("latest")  # type: ignore[attr-defined]


def test_contradicting_shuffle_partitions_are_refused(tmp_path: Path) -> None:
    op = operator(tmp_path, state_partitions=8, conf={"spark.sql.shuffle.partitions": "200"})
    with pytest.raises(ConfigError, match=r"spark.sql.shuffle.partitions=200 contradicts state_partitions=8"):
        op.build_sparkpoint_conf("latest")  # type: ignore[attr-defined]
    same = operator(tmp_path, state_partitions=8, conf={"spark.sql.shuffle.partitions": "8"})
    assert same.build_sparkpoint_conf("latest")[KEY] == "8"  # type: ignore[attr-defined]
