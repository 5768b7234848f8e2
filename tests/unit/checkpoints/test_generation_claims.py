"""The generation claim (``generations/<g>``): one record type, `GenerationInfo`, written
by `Catalog.claim_generation` and read back by `Catalog.generation_claim` for every
reader (the history model, the submit operator finding its run)."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, GenerationInfo, layout
from airflow_sparkpoint.checkpoints.catalog_types import claim_details
from airflow_sparkpoint.checkpoints.history import read_generation
from airflow_sparkpoint.exceptions import CorruptMetadata


def test_a_claim_is_stored_in_its_json_shape_and_read_back_as_written(catalog: Catalog) -> None:
    details = claim_details(restore="latest", plan="chk-3 (batch 7)", app="app-1", submitter="t0k3n",
                            ui="http://driver:4040", config={"trigger": "availableNow"})
    claimed = catalog.claim_generation(details)
    stored = json.loads(catalog.store.get(layout.generation_key(claimed.generation)))
    assert (stored
            == {"generation": 1, "started_at": claimed.started_at, "host": claimed.host, "pid": claimed.pid,
                "details": {"restore": "latest", "plan": "chk-3 (batch 7)", "app": "app-1",
                            "submitter": "t0k3n", "ui": "http://driver:4040",
                            "config": {"trigger": "availableNow"}}})
    read = catalog.generation_claim(1)
    assert read == claimed
    assert read is not None and (read.app, read.ui, read.submitter, read.restore, read.plan,
                                 dict(read.config)) == \
        ("app-1", "http://driver:4040", "t0k3n", "latest", "chk-3 (batch 7)", {"trigger": "availableNow"})
    assert catalog.generation_claim(2) is None
    assert catalog.generations() == [1] and catalog.current_generation() == 1


@pytest.mark.parametrize("body", [
    b"not json",
    b"[1, 2]",
    json.dumps({"generation": 2, "started_at": 1.0}).encode(),  # another generation's
    json.dumps({"generation": True, "started_at": 1.0}).encode(),
    json.dumps({"generation": 1}).encode(),
    json.dumps({"generation": 1, "started_at": "yesterday"}).encode(),
    json.dumps({"generation": 1, "started_at": 1.0, "pid": "not-a-pid"}).encode(),
    json.dumps({"generation": 1, "started_at": 1.0, "details": ["app"]}).encode(),
])
def test_an_unreadable_claim_is_corrupt_and_names_its_key(catalog: Catalog, body: bytes) -> None:
    catalog.store.put(layout.generation_key(1), body)
    with pytest.raises(CorruptMetadata, match=layout.generation_key(1)):
        catalog.generation_claim(1)


def test_an_oversized_claim_is_corrupt_not_read_whole(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    catalog.claim_generation({"plan": "x" * 200})
    monkeypatch.setitem(layout.RECORD_MAX_BYTES, layout.GENERATIONS, 100)
    with pytest.raises(CorruptMetadata, match="generations/"):
        catalog.generation_claim(1)


def test_the_history_shows_an_unreadable_claim_as_unknown_parts(catalog: Catalog,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    catalog.claim_generation(claim_details(restore="none", plan="empty state", app="app-1", submitter="",
                                           ui=None))
    catalog.store.put(layout.generation_key(1), b'{"generation": 1, "started_at": 1.0, "details": 7}')
    with caplog.at_level(logging.WARNING):
        record = read_generation(catalog, 1)
    assert (record.started_at, record.host, record.pid, record.application_id, record.plan) == \
        (None, "", None, "", None)
    assert any("generations/" in r.getMessage() for r in caplog.records), \
        "the unreadable claim was not reported"


def test_the_history_reads_what_the_claim_recorded(catalog: Catalog) -> None:
    details: dict[str, Any] = claim_details(restore="latest", plan="chk-3 (batch 7)", app="app-9",
                                            submitter="s", ui=None, config={"commit.mode": "external"},
                                            airflow={"dag_id": "d", "task_id": "t", "run_id": "r",
                                                     "try_number": "2"})
    claimed = catalog.claim_generation(details)
    record = read_generation(catalog, 1)
    assert (record.started_at, record.host, record.pid) == (claimed.started_at, claimed.host, claimed.pid)
    assert (record.restore, record.plan, record.application_id, dict(record.config)) == \
        ("latest", "chk-3 (batch 7)", "app-9", {"commit.mode": "external"})
    assert record.airflow is not None and record.airflow.try_number == 2


def test_generation_info_round_trips_through_its_json() -> None:
    info = GenerationInfo(3, 12.5, "h", 42, {"app": "a"})
    assert GenerationInfo.from_json(json.loads(json.dumps(info.to_json())), 3) == info
