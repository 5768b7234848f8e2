"""Fixtures shared by the Airflow-side unit tests: a local storage root and the catalog
of the job ``orders`` on it."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.storage import open_storage

JOB = "orders"


@pytest.fixture()
def root(tmp_path: Path) -> str:
    return str(tmp_path / "sp")


@pytest.fixture()
def catalog(root: str) -> Catalog:
    return Catalog(open_storage(root), JOB)
