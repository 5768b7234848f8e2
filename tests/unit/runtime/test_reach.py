"""`runtime.executor_reach`: what the driver makes of the executors' probe reports (the Spark job
itself runs in tests/e2e/test_e2e_shared_mount.py)."""

from __future__ import annotations

from pathlib import Path

from airflow_sparkpoint.runtime.executor_reach import DRIVER_FILE, Executor, _problems

TOKEN = "t0k3n"
EXECUTORS = [Executor("0", "10.0.0.1:7001", 1), Executor("1", "10.0.0.2:7001", 1)]


def probe(tmp_path: Path, *written: tuple[int, str]) -> str:
    (tmp_path / DRIVER_FILE).write_text(TOKEN)
    for partition, address in written:
        (tmp_path / f"task-{partition}").write_text(f"{TOKEN} {address}")
    return str(tmp_path)


def test_every_executor_seeing_the_probe_is_no_problem(tmp_path: Path) -> None:
    probe_dir = probe(tmp_path, (0, "10.0.0.1:40001"), (1, "10.0.0.2:40002"))
    reports = [{"partition": 0, "address": "10.0.0.1:40001", "error": None},
               {"partition": 1, "address": "10.0.0.2:40002", "error": None}]
    assert _problems(reports, EXECUTORS, probe_dir, TOKEN) == []


def test_an_executor_that_does_not_see_the_driver_probe_is_named_with_the_path(tmp_path: Path) -> None:
    probe_dir = probe(tmp_path, (0, "10.0.0.1:40001"))
    reports = [{"partition": 0, "address": "10.0.0.1:40001", "error": None},
               {"partition": 1, "address": "10.0.0.2:40002", "error": "FileNotFoundError: no such file"}]
    [problem] = _problems(reports, EXECUTORS, probe_dir, TOKEN)
    assert "10.0.0.2:40002 (host 10.0.0.2) does not see the driver's probe" in problem
    assert str(tmp_path / DRIVER_FILE) in problem


def test_a_probe_the_driver_cannot_read_back_is_a_problem(tmp_path: Path) -> None:
    probe_dir = probe(tmp_path, (0, "10.0.0.1:40001"))  # executor 1 wrote into a directory of its own
    reports = [{"partition": 0, "address": "10.0.0.1:40001", "error": None},
               {"partition": 1, "address": "10.0.0.2:40002", "error": None}]
    [problem] = _problems(reports, EXECUTORS, probe_dir, TOKEN)
    assert problem.startswith(f"the driver does not see the probe {tmp_path / 'task-1'}")


def test_an_executor_host_without_a_probe_task_is_a_problem(tmp_path: Path) -> None:
    probe_dir = probe(tmp_path, (0, "10.0.0.1:40001"))
    reports = [{"partition": 0, "address": "10.0.0.1:40001", "error": None}]
    assert (_problems(reports, EXECUTORS, probe_dir, TOKEN)
            == ["executor 1 on host 10.0.0.2 ran no probe task"])


def test_the_wait_for_executors_follows_sparks_own_longer_wait() -> None:
    """A queued YARN application or autoscaled pods take longer than a minute: Spark's own
    spark.scheduler.maxRegisteredResourcesWaitingTime, when longer, is the wait."""
    from airflow_sparkpoint.runtime.executor_reach import DEFAULT_WAIT_S, wait_seconds

    assert wait_seconds({}) == DEFAULT_WAIT_S
    assert wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "30s"}) == DEFAULT_WAIT_S
    assert wait_seconds({"spark.scheduler.maxRegisteredResourcesWaitingTime": "5min"}) == 300.0
