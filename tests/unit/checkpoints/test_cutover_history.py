"""The cutovers in the history read model (`load_history`), as the checkpoints page and
its API endpoint (`PipelineHistory.to_json()`) and `sparkpoint cutover list --json`
show them: open, claimed, committed, called off, rolled back."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverClaim, CutoverProgress, CutoverStore
from airflow_sparkpoint.checkpoints.history import load_history
from airflow_sparkpoint.storage import MemoryStorage
from tests.support.cutover_records import cutover_plan

FIRST, SECOND = "1764370000000-0123abcd", "1764370000005-0123abcd"


@pytest.fixture()
def catalog() -> Iterator[Catalog]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    yield Catalog(MemoryStorage(name), "orders")
    MemoryStorage.reset(name)


def test_the_history_shows_each_cutover_s_state_newest_first(catalog: Catalog) -> None:
    store = CutoverStore(catalog)
    store.plan(cutover_plan(FIRST))
    store.end(FIRST, "aborted", step="warmup", reason="called off by ops")
    store.plan(cutover_plan(SECOND, blue_generation=2))
    store.progress(CutoverProgress(SECOND, 7))

    shown = load_history(catalog).to_json()["cutovers"]
    assert [(c["id"], c["step"], c["outcome"]) for c in shown] == [(SECOND, "planned", None),
                                                                   (FIRST, "aborted", "aborted")]
    assert shown[0]["green_replayed_batch"] == 7 and shown[1]["reason"] == "called off by ops"

    store.agree(SECOND, 9, "1764370000006-0123abcd")
    store.claim(CutoverClaim(SECOND, 3, 9, "memory://x/orders/chk-12"))
    newest = load_history(catalog).to_json()["cutovers"][0]
    assert (newest["step"], newest["after_batch"], newest["green_generation"]) == ("claimed", 9, 3)
    store.end(SECOND, "committed", step="first_commit", generation=3,
              reason="generation 3 committed batch 10")
    store.roll_back(SECOND, generation=3, reason="audit")
    newest = load_history(catalog).to_json()["cutovers"][0]
    assert (newest["step"], newest["outcome"]) == ("rolled_back", "committed")
    assert newest["rolled_back_at"] is not None and newest["ended_step"] == "first_commit"


@pytest.mark.usefixtures("airflow_home")  # the page's package imports Airflow
def test_the_page_has_a_row_per_cutover_with_its_state(catalog: Catalog) -> None:
    from airflow_sparkpoint.plugins.page import pipeline_page

    store = CutoverStore(catalog)
    store.plan(cutover_plan(FIRST))
    store.end(FIRST, "aborted", step="warmup", reason="called off <by> ops")
    store.plan(cutover_plan(SECOND, blue_generation=2))
    html = pipeline_page(load_history(catalog).to_json(), "sp", "/sparkpoint")
    table = html[html.index('<table id="cutovers">'):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == 3
    assert "planned (open)" in table and "aborted (called off)" in table
    assert "called off &lt;by&gt; ops" in table  # escaped


def test_no_cutover_shows_none(catalog: Catalog) -> None:
    assert load_history(catalog).to_json()["cutovers"] == []


@pytest.mark.usefixtures("airflow_home")  # the page's package imports Airflow
def test_blue_s_final_savepoint_and_the_rollback_s_return_point_are_shown(catalog: Catalog) -> None:
    """Once green claimed, the cutover names blue's final checkpoint and savepoint of N; a
    rollback after it says where the job's lineage returned (the JSON and the page)."""
    from airflow_sparkpoint.plugins.page import pipeline_page

    store = CutoverStore(catalog)
    store.plan(cutover_plan(SECOND, blue_generation=2))
    shown = load_history(catalog).to_json()["cutovers"][0]
    assert (shown["blue_checkpoint"], shown["blue_savepoint"], shown["rolled_back_to"]) == (None, None, None)
    store.agree(SECOND, 9, "1764370000006-0123abcd")
    savepoint = "memory://x/orders/savepoints/savepoint-12-1c2d3e4f"
    store.claim(CutoverClaim(SECOND, 3, 9, "memory://x/orders/chk-12", savepoint=savepoint))
    store.roll_back(SECOND, generation=3, reason="audit", restore=savepoint)
    shown = load_history(catalog).to_json()["cutovers"][0]
    assert (shown["blue_checkpoint"], shown["blue_savepoint"], shown["rolled_back_to"]) == (
        "memory://x/orders/chk-12", savepoint, savepoint)
    html = pipeline_page(load_history(catalog).to_json(), "sp", "/sparkpoint")
    table = html[html.index('<table id="cutovers">'):]
    table = table[:table.index("</table>")]
    assert "blue&#39;s final savepoint" in table or "blue's final savepoint" in table
    assert table.count(savepoint) == 2  # the column and "rolled back ... to"
