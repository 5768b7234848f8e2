"""Savepoint history retention around a cutover (issue 49) keeps what a rollback of
green's generation could still return to, and no longer everything (the review9 fixes,
`checkpoints.cutover_lineage.cutover_savepoints`): the other side of each bound, where
it must keep. A real store (memory), the records a real blue, orchestrator and green
write."""

from __future__ import annotations

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
from airflow_sparkpoint.exceptions import CutoverError
from airflow_sparkpoint.services.rollback import abort_generation
from tests.support.cutover_records import CID, N, blue_stopped, cutover_plan, green_took_over
from tests.support.fake_sinks import FakeSink
from tests.support.records import put_checkpoint


def _blue_planned(catalog: Catalog, warmup_batch: int) -> None:
    """Blue (generation 1) checkpointed `warmup_batch`; cutover `CID` warms green up from it."""
    catalog.claim_generation()
    warmup = put_checkpoint(catalog, batch_id=warmup_batch, generation=1)
    uri = catalog.checkpoint_uri(warmup.id)
    CutoverStore(catalog).plan(cutover_plan(warmup_uri=uri, warmup_batch=warmup_batch))


def _savepoint(catalog: Catalog, batch: int, generation: int = 1) -> str:
    meta = put_checkpoint(catalog, batch_id=batch, generation=generation)
    return catalog.create_savepoint(catalog.handle(meta), generation=generation).uri


def test_blue_s_savepoint_of_a_requested_batch_is_kept_before_the_agreement(catalog: Catalog) -> None:
    """The orchestrator filed blue's stop_after request and died before ``agreed``; blue
    stopped after N and took S. Its retry (or a stalled orchestrator) may still agree on
    that request and green claim S: S is kept, the scheduled savepoints around it not."""
    _blue_planned(catalog, 1)
    before = _savepoint(catalog, N - 1)
    ControlChannel(catalog).submit("stop_after", generation=1, after_batch=N, cutover=CID)
    s = _savepoint(catalog, N)
    newer = _savepoint(catalog, N, generation=1)  # a second savepoint of N: either may be S
    latest = _savepoint(catalog, N + 1, generation=1)
    assert CutoverStore(catalog).read(CID).agreed is None

    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)

    assert disposed == [before]
    assert {e.uri for e in catalog.list_savepoints()} == {s, newer, latest}


def test_an_unreadable_control_request_keeps_every_savepoint_of_blue_from_the_warm_up_on(
        catalog: Catalog) -> None:
    """Fail closed: a request that cannot be read may be the one the agreement will name."""
    _blue_planned(catalog, 1)
    old = _savepoint(catalog, 0)  # before the warm-up batch: never S
    taken = [_savepoint(catalog, batch) for batch in range(1, 4)]
    catalog.store.put(f"{layout.CONTROL}/1764370000001-0123abcd.request.json", b"{torn")

    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == [old]
    assert {e.uri for e in catalog.list_savepoints()} == set(taken)


def test_s_is_kept_while_green_s_lineage_committed_nothing_past_n_by_the_commit_head(
        catalog: Catalog, sink: FakeSink) -> None:
    """The commit head names blue's commits through N, or nothing: S stays, and the rollback
    of green returns there."""
    s = blue_stopped(catalog, sink)
    green, newer = green_took_over(catalog, sink)

    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == [newer[0]]
    abort_generation(catalog, green)
    assert catalog.origins()[-1].uri == s


def test_an_unreadable_end_record_is_read_as_open_while_green_may_still_claim(catalog: Catalog) -> None:
    """Blue's generation + 1 is not taken yet: the cutover may be open, so blue's savepoint
    of a requested batch stays (as for an open cutover); the other ones go."""
    _blue_planned(catalog, 1)
    ControlChannel(catalog).submit("stop_after", generation=1, after_batch=N, cutover=CID)
    other = _savepoint(catalog, N - 1)
    s = _savepoint(catalog, N)
    latest = _savepoint(catalog, N + 1)
    catalog.store.put(layout.cutover_key(CID, "done"), b"{not json")

    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == [other]
    assert {e.uri for e in catalog.list_savepoints()} == {s, latest}


def test_an_unreadable_end_record_of_a_claimed_cutover_keeps_s_and_the_rollback_returns_there(
        catalog: Catalog, sink: FakeSink) -> None:
    """How the cutover ended is not read by the rule: S stays while green's lineage is the
    newest, and the rollback of green returns there (one rule)."""
    s = blue_stopped(catalog, sink)
    green, newer = green_took_over(catalog, sink)
    catalog.store.put(layout.cutover_key(CID, "done"), b"{not json")

    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == [newer[0]]
    abort_generation(catalog, green)
    assert catalog.origins()[-1].uri == s


def test_an_unreadable_plan_still_stops_the_pass(catalog: Catalog) -> None:
    """Nothing is known of that cutover (not even blue's generation): nothing is judged."""
    _blue_planned(catalog, 1)
    for batch in range(1, 4):
        _savepoint(catalog, batch, generation=1)
    catalog.store.put(layout.cutover_key(CID, "plan"), b"{not json")

    with pytest.raises(CutoverError, match="unreadable cutover record"):
        savepoint_history_retention(catalog, max_count=1, max_age_s=None)
    assert len(catalog.list_savepoints()) == 3
