"""The launch record (`checkpoints.launches`): where a submit started its driver, written
once by the task, read back by `sparkpoint status` as untrusted input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.checkpoints.launches import LaunchRecord, read_launch, write_launch
from airflow_sparkpoint.exceptions import ConfigError, CorruptRecord
from airflow_sparkpoint.storage import open_storage

TOKEN = "0123456789abcdef0123456789abcdef"


@pytest.fixture()
def catalog(tmp_path: Path) -> Catalog:
    return Catalog(open_storage(str(tmp_path / "sp")), "orders")


@pytest.mark.parametrize("driver", [
    {"kind": "kubernetes", "namespace": "spark-jobs", "pod": "orders-1a2b-driver"},
    {"kind": "yarn", "application_id": "application_1764383000000_0007"},
    {"kind": "process", "host": "worker-3", "pgid": 4242, "log": "/tmp/sparkpoint-submit-x/driver.log"},
])
def test_a_launch_record_round_trips(catalog: Catalog, driver: dict[str, object]) -> None:
    write_launch(catalog, LaunchRecord(TOKEN, "cluster" if driver["kind"] != "process" else "client", driver))
    read = read_launch(catalog, TOKEN)
    assert read is not None and dict(read.driver) == driver and read.token == TOKEN
    assert read_launch(catalog, "f" * 32) is None


@pytest.mark.parametrize(("body", "why"), [
    ({"token": TOKEN, "deploy_mode": "cluster", "driver": {"kind": "ssh", "host": "h"}, "launched_at": 1.0,
      "schema_version": 1}, "kind one of"),
    ({"token": TOKEN, "deploy_mode": "both", "driver": {"kind": "yarn", "application_id": "a"},
      "launched_at": 1.0, "schema_version": 1}, "deploy_mode='both'"),
    ({"token": TOKEN, "deploy_mode": "client", "driver": {"kind": "process", "host": "h", "pgid": "1"},
      "launched_at": 1.0, "schema_version": 1}, "pgid='1'"),
    ({"schema_version": 2}, "schema version 1"),
])
def test_a_malformed_launch_record_is_refused_by_its_reader(catalog: Catalog, body: object, why: str) -> None:
    catalog.store.put(layout.launch_key(TOKEN), json.dumps(body).encode())
    with pytest.raises(CorruptRecord, match=why):
        read_launch(catalog, TOKEN)


def test_a_bad_token_or_driver_is_never_written(catalog: Catalog) -> None:
    with pytest.raises(ConfigError, match="submit token '../x' is invalid"):
        write_launch(catalog, LaunchRecord("../x", "cluster", {"kind": "yarn", "application_id": "a"}))
    with pytest.raises(ValueError, match="kind one of"):
        write_launch(catalog, LaunchRecord(TOKEN, "cluster", {"kind": "nomad"}))
    assert list(catalog.store.list("launches/")) == []
