"""The test-only fault hook kills for real, and the Spark side never imports Airflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from airflow_sparkpoint import faults


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def test_armed_fault_sigkills_the_process_once(tmp_path):
    marker = tmp_path / "fired"
    code = "from airflow_sparkpoint import faults; faults.maybe_kill('copy', 2); print('survived')"
    env = {faults.ENV: "copy:2", faults.ENV_ONCE: str(marker)}
    first = _run(code, **env)
    assert first.returncode == -signal.SIGKILL
    assert "killing driver at copy:2" in first.stdout
    assert marker.exists()
    second = _run(code, **env)
    assert second.returncode == 0 and "survived" in second.stdout


def test_other_points_and_batches_do_not_fire(monkeypatch):
    monkeypatch.setenv(faults.ENV, "copy:2")
    faults.maybe_kill("copy", 3)
    faults.maybe_kill("metadata", 2)  # still alive


def test_malformed_fault_spec_is_rejected(monkeypatch):
    monkeypatch.setenv(faults.ENV, "explode:soon")
    with pytest.raises(ValueError, match="explode:soon"):
        faults.maybe_kill("copy", 1)


def test_spark_side_imports_without_airflow():
    code = (
        "import sys; sys.modules['airflow'] = None\n"
        "import airflow_sparkpoint.runtime, airflow_sparkpoint.sinks, airflow_sparkpoint.checkpoints\n"
        "import airflow_sparkpoint.storage, airflow_sparkpoint.cli\n"
        "from airflow_sparkpoint.runtime import SparkpointJob\n"
        "from airflow_sparkpoint.sinks import DeltaSink, S3Sink, DirectorySink\n"
        "assert not [m for m in sys.modules if m.startswith('airflow.')]\n"
        "print('ok')"
    )
    result = _run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_halfway_fires_once_half_the_steps_are_done(monkeypatch):
    monkeypatch.setenv(faults.ENV, "promoting:4")
    fired: list[tuple[str, int]] = []
    monkeypatch.setattr(faults, "kill_driver", lambda: fired.append(("killed", 0)))
    for done in range(1, 11):
        faults.maybe_kill_halfway("promoting", 4, done, 10)
        assert len(fired) == (1 if done >= 5 else 0)
    faults.maybe_kill_halfway("promoting", 4, 1, 1)  # a one-step commit fires at its only step
    assert len(fired) == 2


def test_pause_point_blocks_until_released_and_reports_where(tmp_path):
    code = ("from airflow_sparkpoint import faults; "
            "print('paused' if faults.pause('promoting', 3, generation=7) else 'not paused', flush=True)")
    env = {**os.environ, faults.PAUSE_ENV: "stage:1,promoting:3", faults.PAUSE_DIR_ENV: str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    try:
        reached = tmp_path / "promoting.reached"
        for _ in range(600):
            if reached.exists():
                break
            assert proc.poll() is None, "the process went past its pause point"
            import time
            time.sleep(0.05)
        assert json.loads(reached.read_text()) == {"pid": proc.pid, "batch": 3, "generation": 7}
        assert proc.poll() is None  # still held
        (tmp_path / "promoting.release").touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert "paused" in out.split() and proc.returncode == 0


def test_pause_points_of_other_batches_or_points_do_not_pause(monkeypatch, tmp_path):
    monkeypatch.setenv(faults.PAUSE_ENV, "promoting:3")
    monkeypatch.setenv(faults.PAUSE_DIR_ENV, str(tmp_path))
    assert faults.pause("promoting", 4) is False
    assert faults.pause("stage", 3) is False
    assert not list(tmp_path.iterdir())
