"""Restore-drill records live next to the snapshot and never break a listing."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.checkpoints.verification import (
    VerificationRecord,
    read_verification,
    read_verifications,
    verification_key,
    write_verification,
)
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage.memory import MemoryStorage


def test_a_record_round_trips_next_to_its_snapshot():
    store = MemoryStorage()
    record = VerificationRecord(verified_at=1795307061.5, level="state", duration_s=3.25,
                                checks={"files": 14, "rows": 1250}, verified_by="sparkpoint verify")
    write_verification(store, "savepoints/savepoint-7-ab12cd34", record)
    assert verification_key("chk-7") == "chk-7/_verification.json"
    assert store.exists("savepoints/savepoint-7-ab12cd34/_verification.json")
    assert read_verification(store, "savepoints/savepoint-7-ab12cd34") == record
    assert read_verification(store, "chk-7") is None
    assert read_verifications(store, ["chk-7", "savepoints/savepoint-7-ab12cd34"]) == {
        "savepoints/savepoint-7-ab12cd34": record
    }


def test_a_failed_drill_keeps_its_error():
    record = VerificationRecord(verified_at=1.0, level="drill", duration_s=1.0,
                                error="state store 0/3 unreadable")
    assert not record.ok
    assert VerificationRecord.from_json(record.to_json()).error == "state store 0/3 unreadable"


def test_an_unreadable_record_reads_as_never_verified(caplog):
    store = MemoryStorage()
    store.put("chk-3/_verification.json", b"{not json")
    assert read_verification(store, "chk-3") is None
    assert "chk-3/_verification.json" in caplog.text


def test_unknown_level_is_refused():
    with pytest.raises(ConfigError, match="'everything'"):
        VerificationRecord(verified_at=1.0, level="everything", duration_s=0.0)
