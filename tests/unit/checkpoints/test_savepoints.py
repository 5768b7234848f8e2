"""The savepoint use case (`services.savepoint`) that `sparkpoint savepoint` and
`SparkpointSavepointOperator` share: which run is asked, and the fallback to the latest
completed checkpoint."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata
from airflow_sparkpoint.exceptions import CatalogError, ControlError
from airflow_sparkpoint.services.savepoint import (
    request_savepoint,
    savepoint_from_latest_checkpoint,
    savepoint_source,
    wait_for_savepoint,
)
from tests.support.records import write_status


def test_only_a_live_current_run_is_asked(catalog: Catalog) -> None:
    assert savepoint_source(catalog, 60).run is None
    assert savepoint_source(catalog, 60).why_not_running() == "has no live run (no status record)"
    catalog.claim_generation()
    write_status(catalog)
    assert savepoint_source(catalog, 60).run is not None
    write_status(catalog, heartbeat_age=120)
    stale = savepoint_source(catalog, 60)
    assert stale.run is None
    assert re.fullmatch(r"has no live run \(last state running, generation 1, heartbeat \d+ s old\)",
                        stale.why_not_running())
    write_status(catalog)
    catalog.claim_generation()  # a newer generation claimed, not yet reporting: generation 1 is superseded
    assert savepoint_source(catalog, 60).run is None


def test_the_fallback_copies_the_latest_checkpoint_unless_refused(
    catalog: Catalog, make_checkpoint: Callable[..., SnapshotMetadata]
) -> None:
    catalog.claim_generation()
    write_status(catalog, state="finished")
    source = savepoint_source(catalog, 60)
    with pytest.raises(CatalogError, match="has no completed checkpoint .*nothing to savepoint"):
        savepoint_from_latest_checkpoint(catalog, source, refused_by=None)
    make_checkpoint(catalog, {"state/0/1.delta": b"a"})
    latest = make_checkpoint(catalog, {"state/0/2.delta": b"b"})
    with pytest.raises(CatalogError, match="--no-from-checkpoint refuses to make one"):
        savepoint_from_latest_checkpoint(catalog, source, refused_by="--no-from-checkpoint")
    assert catalog.list_savepoints() == [], "a refusal makes nothing"
    lines: list[str] = []
    copied, handle = savepoint_from_latest_checkpoint(catalog, source, refused_by=None, stop=True,
                                                      announce=lines.append)
    assert copied.id == latest.id and handle.metadata.batch_id == latest.batch_id
    [line] = lines
    assert re.fullmatch(r"job 'orders' has no live run \(last state finished, generation 1, heartbeat \d+ s "
                        r"old\); nothing to stop; making a savepoint from its latest completed checkpoint "
                        rf"chk-{latest.id} \(batch {latest.batch_id}\)", line), line
    assert [e.metadata.id for e in catalog.list_savepoints() if e.metadata] == [handle.metadata.id]


def test_the_wait_ends_when_the_asked_run_is_superseded(catalog: Catalog) -> None:
    catalog.claim_generation()
    write_status(catalog)
    source = savepoint_source(catalog, 60)
    assert source.run is not None
    request = request_savepoint(catalog, source.run, stop=False, timeout_s=60, requested_by="test")
    assert request.generation == 1 and request.kind == "savepoint"
    catalog.claim_generation()  # generation 2 supersedes the asked run before it took the request
    outcome: dict[str, Any] = {}

    def waiting() -> None:
        try:
            wait_for_savepoint(catalog, request, timeout_s=60, poll_s=0.05, max_heartbeat_age=60)
        except ControlError as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=waiting)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the wait did not end"
    assert "was not taken: the job is not running" in str(outcome.get("error"))
    assert ControlChannel(catalog).pending() == [], "the request was withdrawn"


def test_a_checkpoint_removed_while_it_is_copied_is_a_clear_refusal(
    catalog: Catalog, make_checkpoint: Callable[..., SnapshotMetadata]
) -> None:
    """Retention may delete the checkpoint a savepoint copies when the copy stalls past its
    grace (found by the simulation, 20261401:4730): a CatalogError naming the checkpoint
    and the missing file, no savepoint completed."""
    catalog.claim_generation()
    write_status(catalog, state="finished")
    latest = make_checkpoint(catalog, {"state/0/1.delta": b"a", "state/0/2.delta": b"b"})
    handle = catalog.handle(latest)  # its _metadata read: the copy starts from it
    [gone] = [info.key for info in catalog.store.list("shared")
              if info.key.startswith("shared/state/0/2.delta~")]
    catalog.store.delete([gone])  # retention, while the copy stalls

    with pytest.raises(CatalogError, match=rf"chk-{latest.id}.* was removed while it was copied into a "
                                           r"savepoint.*take the savepoint again") as refused:
        catalog.create_savepoint(handle)
    assert "state/0/2.delta" in str(refused.value)
    assert [e for e in catalog.list_savepoints() if e.metadata is not None] == []
