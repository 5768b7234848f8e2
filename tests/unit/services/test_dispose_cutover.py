"""Savepoint history retention and blue's final savepoint S of a zero-downtime cutover
(issue 49): S stays while a rollback of green's generation would return there (the newest
lineage is the cutover's green lineage, `checkpoints.cutover_lineage.cutover_of_lineage`),
or while green may still claim the cutover naming it; after that it is ordinary history.
A real store (memory), the records a real blue, green and rollback write."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.checkpoints.lineage import new_origin
from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention
from airflow_sparkpoint.services.cutover import call_off
from airflow_sparkpoint.services.dispose import dispose_savepoints, dispose_snapshot
from airflow_sparkpoint.services.rollback import abort_generation
from airflow_sparkpoint.storage import open_storage
from tests.support.cli_runs import run
from tests.support.cutover_records import CID, N, blue_stopped, green_took_over
from tests.support.fake_sinks import FakeSink

WHY_S = f"blue's final savepoint of cutover {CID}: a rollback of green's generation returns there"


def _savepoints(catalog: Catalog) -> set[str]:
    return {e.uri for e in catalog.list_savepoints() if e.metadata is not None}


def test_retention_keeps_blue_s_final_savepoint_while_green_s_lineage_is_the_newest(
        catalog: Catalog, sink: FakeSink) -> None:
    s = blue_stopped(catalog, sink)
    green, newer = green_took_over(catalog, sink)
    assert CutoverStore(catalog).read(CID).claimed.savepoint == s  # type: ignore[union-attr]

    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)
    assert disposed == [newer[0]]  # green's older savepoint is ordinary history
    assert _savepoints(catalog) == {s, newer[1]}

    done = dispose_savepoints(catalog, keep=1, older_than_s=None)
    assert done.disposed == []
    assert dict(done.reasons) == {newer[1]: "the newest", s: WHY_S}

    # ... and so the rollback of green's generation returns the job to S, exactly.
    abort_generation(catalog, green)
    origin = catalog.origins()[-1]
    assert (origin.generation, origin.kind, origin.uri, origin.batch_id) == (green + 1, "savepoint", s, N)
    assert catalog.restart_point().uri == s
    # S is now where the newest lineage starts: still kept, for that reason.
    done = dispose_savepoints(catalog, keep=1, older_than_s=None)
    assert s in done.kept and done.disposed == []


def test_blue_s_final_savepoint_is_ordinary_history_once_another_lineage_is_the_newest(
        catalog: Catalog, sink: FakeSink) -> None:
    s = blue_stopped(catalog, sink)
    green, newer = green_took_over(catalog, sink)
    # A restore by path of green's checkpoint of N+2 (batch != N: not green's lineage by
    # `cutover_of_lineage`): a rollback of it returns to its own checkpoint, never to S.
    base = next(m for m in catalog.checkpoints() if m.batch_id == N + 2)
    restart = catalog.claim_generation()
    catalog.write_origin(new_origin(restart.generation, kind="checkpoint",
                                    uri=catalog.checkpoint_uri(base.id),
                                    base_id=base.id, snapshot_id=base.id, batch_id=base.batch_id,
                                    id_floor=catalog.next_checkpoint_id() - 1, restore={}, live_dir=None,
                                    host="h", pid=1, base_generation=green))
    disposed = savepoint_history_retention(catalog, max_count=1, max_age_s=None)
    assert set(disposed) == {s, newer[0]}
    assert _savepoints(catalog) == {newer[1]}


def test_blue_s_final_savepoint_is_kept_until_green_claims_and_not_after_a_call_off(
        catalog: Catalog, sink: FakeSink) -> None:
    """Between blue's stop and green's claim the only record naming S is the request's
    result; green's claim will name it. A newer savepoint (from the latest checkpoint,
    blue's X) does not make S history while the cutover is open; a call-off does."""
    s = blue_stopped(catalog, sink)
    later = catalog.create_savepoint(catalog.handle(catalog.checkpoints()[-1])).uri
    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == []
    done = dispose_savepoints(catalog, keep=1, older_than_s=None)
    assert dict(done.reasons)[s].startswith(f"blue's final savepoint of open cutover {CID}")
    call_off(catalog, CID, reason="test", by="test")
    assert savepoint_history_retention(catalog, max_count=1, max_age_s=None) == [s]
    assert _savepoints(catalog) == {later}


def test_dispose_by_hand_removes_s_and_says_what_it_gives_up(
        catalog: Catalog, sink: FakeSink, caplog: pytest.LogCaptureFixture) -> None:
    """As for the newest lineage's origin, a disposal by path is on purpose: it goes, with
    a warning naming the rule that kept it; the rollback then returns to green's own
    checkpoint (exact output, green's state)."""
    s = blue_stopped(catalog, sink)
    green, _newer = green_took_over(catalog, sink)
    with caplog.at_level(logging.WARNING):
        uri, _count = dispose_snapshot(catalog, s)
    assert uri == s and s not in _savepoints(catalog)
    assert any(WHY_S in r.getMessage() for r in caplog.records), caplog.text
    abort_generation(catalog, green)
    origin = catalog.origins()[-1]
    assert (origin.kind, origin.batch_id) == ("checkpoint", N)


def test_the_command_line_names_the_rule_and_warns_on_a_disposal_by_path(
        tmp_path: Path, sink: FakeSink, capsys: pytest.CaptureFixture[str]) -> None:
    """`sparkpoint dispose --keep 1` on a local root says why S stays; `sparkpoint
    dispose S` removes it and says on stderr what it was kept for (docs/CLI.md)."""
    root = tmp_path / "root"
    root.mkdir()
    catalog = Catalog(open_storage(str(root)), "orders")
    s = blue_stopped(catalog, sink)
    _green, newer = green_took_over(catalog, sink)
    code, out, err = run(capsys, "dispose", "--dir", str(root), "--job", "orders", "--keep", "1")
    assert code == 0, err
    assert f"disposed {newer[0]}" in out.splitlines()
    assert f"kept {s} ({WHY_S})" in out.splitlines(), out
    code, out, err = run(capsys, "dispose", "--dir", str(root), "--job", "orders", s)
    assert code == 0, err
    assert WHY_S in err and s not in _savepoints(catalog)
