"""The UI's stored jobs of a connection (`plugins.pipelines.stored_jobs`) follow the one
rule of which directories under a root are jobs (`services.stores.jobs_under`, issue #47)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None


def test_the_ui_lists_the_jobs_the_cli_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_sparkpoint.plugins.pipelines import stored_jobs
    from airflow_sparkpoint.services.stores import jobs_under, open_storage

    root = tmp_path / "sp"
    for name in ("orders", "clicks", "_scratch", ".trash", "a b", "x..y"):
        (root / name).mkdir(parents=True)
    monkeypatch.setenv("AIRFLOW_CONN_SP_JOBS", json.dumps({"conn_type": "sparkpoint", "host": str(root)}))
    assert stored_jobs("sp_jobs") == list(jobs_under(open_storage(str(root)))) == ["clicks", "orders"]
