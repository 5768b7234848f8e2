"""The cutover records (`checkpoints.cutover`) and the stop_after request's record
(`checkpoints.control_records`): write-once, one open cutover at a time, old readers
refuse what they cannot serve."""

from __future__ import annotations

import json

import pytest

from airflow_sparkpoint.checkpoints import layout
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel, ControlRequest, ControlResult
from airflow_sparkpoint.checkpoints.control_records import _check_schema
from airflow_sparkpoint.checkpoints.cutover import CutoverClaim, CutoverProgress, CutoverStore
from airflow_sparkpoint.exceptions import ConfigError, ControlError, CutoverError
from tests.support.cutover_records import CID, cutover_plan


def test_a_stop_after_request_round_trips_with_schema_2_and_other_kinds_keep_schema_1() -> None:
    request = ControlRequest(CID, "stop_after", "orders", 1.0, 2.0, 3, "me", after_batch=7)
    body = request.to_json()
    assert body["schema_version"] == 2 and body["after_batch"] == 7
    assert ControlRequest.from_json(body) == request
    stop = ControlRequest(CID, "stop", "orders", 1.0, 2.0, 3, "me").to_json()
    assert stop["schema_version"] == 1 and "after_batch" not in stop  # what earlier releases read
    result = ControlResult(CID, "completed", 3, None, 7, None, 9.0, checkpoint="memory://x/orders/chk-8")
    assert result.to_json()["schema_version"] == 2
    assert ControlResult.from_json(result.to_json()) == result


def test_an_earlier_release_refuses_a_stop_after_request_as_unreadable() -> None:
    """A driver of the release before (it read schema <= 1) never serves stop_after as a stop."""
    body = ControlRequest(CID, "stop_after", "orders", 1.0, 2.0, 3, after_batch=7).to_json()
    with pytest.raises(ControlError, match=r"schema_version 2; this release reads <= 1"):
        _check_schema_of_release(body, 1)


def _check_schema_of_release(data: dict[str, object], reads: int) -> None:
    import airflow_sparkpoint.checkpoints.control_records as records

    saved = records.SCHEMA_VERSION
    records.SCHEMA_VERSION = reads
    try:
        _check_schema(data, "control request")
    finally:
        records.SCHEMA_VERSION = saved


def test_an_unknown_kind_is_refused_naming_it() -> None:
    body = {**ControlRequest(CID, "stop", "orders", 1.0, 2.0, 3).to_json(), "kind": "drain"}
    with pytest.raises(ControlError,
                       match=r"kind 'drain' is unknown to this release; it serves savepoint, stop, "
                             r"cancel, stop_after"):
        ControlRequest.from_json(body)
    with pytest.raises(ControlError, match=r"needs after_batch"):
        ControlRequest.from_json({**body, "kind": "stop_after", "schema_version": 2})
    with pytest.raises(ControlError, match=r"after_batch=4 belongs to stop_after requests, not to stop"):
        ControlRequest.from_json({**body, "kind": "stop", "after_batch": 4})


def test_submit_checks_after_batch(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    for bad in (None, -1, True, "3"):
        with pytest.raises(ConfigError, match="after_batch"):
            channel.submit("stop_after", generation=1, after_batch=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="belongs to stop_after"):
        channel.submit("stop", generation=1, after_batch=3)
    assert list(catalog.store.list(layout.CONTROL)) == []  # nothing written
    request = channel.submit("stop_after", generation=1, after_batch=3)
    assert channel.read_request(request.id).after_batch == 3


def test_a_result_naming_a_checkpoint_of_another_place_is_refused(catalog: Catalog) -> None:
    channel = ControlChannel(catalog)
    request = channel.submit("stop_after", generation=1, after_batch=3)
    channel.acknowledge(request, 1)
    channel.complete(request, generation=1, batch_id=3, checkpoint="../other/chk-1")
    with pytest.raises(ControlError, match=r"names checkpoint '../other/chk-1', not one of job 'orders'"):
        channel.result(request.id)


def test_records_are_written_once_and_one_cutover_is_open_at_a_time(catalog: Catalog) -> None:
    store = CutoverStore(catalog)
    assert store.open_cutover() is None
    store.plan(cutover_plan())
    with pytest.raises(CutoverError, match=f"has cutover {CID} open \\(planned\\)"):
        store.plan(cutover_plan("1764370000001-0123abcd"))
    store.progress(CutoverProgress(CID, 2, 0.5))
    store.progress(CutoverProgress(CID, 3, 0.5))  # overwritten
    store.agree(CID, 5, "1764370000002-0123abcd")
    with pytest.raises(CutoverError, match="already has its agreed record"):
        store.agree(CID, 6, "1764370000003-0123abcd")
    store.claim(CutoverClaim(CID, 4, 5, "memory://x/orders/chk-6"))
    state = store.read(CID)
    assert (state.step, state.progress.replayed_batch, state.agreed.after_batch) == ("claimed", 3, 5)  # type: ignore[union-attr]
    first = store.end(CID, "committed", step="first_commit", generation=4)
    again = store.end(CID, "aborted", step="claim", reason="late")
    assert again == first  # the first end holds; the second writer learns it
    assert store.open_cutover() is None and store.read(CID).step == "committed"
    with pytest.raises(CutoverError, match="is done \\(committed at first_commit"):
        store.progress(CutoverProgress(CID, 6))
    store.plan(cutover_plan("1764370000009-0123abcd"))  # the next one may open



def test_two_cutovers_planned_at_once_leave_at_most_one_open(catalog: Catalog) -> None:
    """The open check and the plan's write are two steps: two planners can both pass the
    check (found by `make explore` at 20262004:4832: two cutovers open, the second's
    agreement sent blue a second stop_after, and the end refused every start). The one
    that finds another open plan after its own write ends its own and is refused."""
    store = CutoverStore(catalog)
    first, second = cutover_plan("1764370000000-aaaaaaaa"), cutover_plan("1764370000001-bbbbbbbb")
    write = store._create
    raced: list[str] = []

    def racing(cutover_id: str, part: str, body: dict[str, object]) -> None:
        if cutover_id == second.id and part == "plan" and not raced:
            raced.append(first.id)  # the other planner passed its check too and wrote first
            write(first.id, "plan", first.to_json())
        write(cutover_id, part, body)

    store._create = racing  # type: ignore[method-assign]
    with pytest.raises(CutoverError, match=f"cutover {first.id} was planned at the same time"):
        store.plan(second)
    assert raced, "the race was played"
    assert [i for i in store.ids() if store.read(i).open] == [first.id]
    assert store.read(second.id).done.outcome == "aborted"  # type: ignore[union-attr]

def test_claim_needs_an_agreement_and_acutover_plan(catalog: Catalog) -> None:
    store = CutoverStore(catalog)
    with pytest.raises(CutoverError, match="has no plan"):
        store.agree(CID, 5, "r")
    store.plan(cutover_plan())
    with pytest.raises(CutoverError, match="is not agreed"):
        store.claim(CutoverClaim(CID, 4, 5, "chk-6"))


@pytest.mark.parametrize(("field", "value", "message"), [
    ("green_job", "orders", "blue's own job name"),
    ("mode", "both", "mode='both' is invalid"),
    ("blue_generation", 0, "blue_generation=0 is invalid"),
    ("reach_timeout_s", float("nan"), "reach_timeout_s=nan is invalid"),
    ("id", "c1", "cutover id 'c1' is invalid"),
])
def test_a_bad_plan_is_refused_naming_the_value(field: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cutover_plan(**{field: value})


def test_an_unreadable_plan_counts_as_open(catalog: Catalog) -> None:
    catalog.store.put(layout.cutover_key(CID, "plan"), b"{not json")
    with pytest.raises(CutoverError, match="unreadable cutover record"):
        CutoverStore(catalog).open_cutover()
    catalog.store.put(layout.cutover_key(CID, "plan"),
                      json.dumps({**cutover_plan().to_json(), "job": "other"}).encode())
    with pytest.raises(CutoverError, match="holds cutover .* of job 'other'"):
        CutoverStore(catalog).read(CID)


def test_a_stop_after_names_its_cutover_and_a_claim_and_a_rollback_what_to_restore(catalog: Catalog) -> None:
    """Extended records (never renamed): a stop_after request names the cutover it is
    filed for (absent for others, as earlier releases wrote them); its completed result
    names the run's final savepoint beside the checkpoint; green's claim names blue's
    final savepoint; a rollback record where the lineage returned."""
    request = ControlRequest(CID, "stop_after", "orders", 1.0, 2.0, 3, after_batch=7, cutover=CID)
    assert request.to_json()["cutover"] == CID and ControlRequest.from_json(request.to_json()) == request
    assert "cutover" not in ControlRequest(CID, "stop_after", "orders", 1.0, 2.0, 3, after_batch=7).to_json()
    result = ControlResult(CID, "completed", 3, "memory://x/orders/savepoints/savepoint-8-ab12cd34", 7, None,
                           9.0, checkpoint="memory://x/orders/chk-8")
    assert ControlResult.from_json(result.to_json()) == result
    claim = CutoverClaim(CID, 4, 7, "memory://x/orders/chk-8", 1.0, savepoint=result.savepoint)
    assert CutoverClaim.from_json(claim.to_json()) == claim
    old = {k: v for k, v in claim.to_json().items() if k != "savepoint"}  # a claim of the release before
    assert CutoverClaim.from_json(old).savepoint is None
    channel = ControlChannel(catalog)
    with pytest.raises(ConfigError, match="cutover='x' belongs to stop_after requests"):
        channel.submit("stop", generation=1, cutover="x")
    filed = channel.submit("stop_after", generation=1, after_batch=3, cutover=CID)
    assert channel.read_request(filed.id).cutover == CID
