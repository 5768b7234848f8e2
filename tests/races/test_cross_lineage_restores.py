"""Restores by path of an abandoned lineage's snapshot (issue #45 items 1-3, invariant 12),
with real drivers.

A first run drains six files (batches 0-5) and keeps every checkpoint; a savepoint of
batch 5 is taken. A second run restores the checkpoint of batch 1 by path (a new lineage:
the first one's batches 2-5 are abandoned) and is killed. A third start restores the
first lineage's snapshot of batch 5 (its savepoint, or its checkpoint) by path:

* item 1: the second run rewound the table to batch 1: the sink no longer holds what the
  snapshot's lineage committed. The start is refused before anything is written, with
  ``restore.sinkAhead=fail``, and with ``rewind`` on an append: the second run's recovery
  discarded the first lineage's rewound-away files, so no rewind can bring them back (the
  start was accepted, and batches 2-5 were lost). A merge's files are its own and still
  there: ``rewind`` brings back the first lineage's commit of batch 5;
* item 2: the second run drained more input in batches of two files; a rewind to the
  savepoint lands on the first lineage's own commit of batch 5 (a merge), or is refused
  when that commit's files are gone (an append: the second run discarded them); it
  landed on the second lineage's commit, and four files were counted twice;
* item 3 (external commit mode, a file sink and Delta): the second run's recovery aborted
  the first lineage's confirmed transactions of batches 2-5; the snapshot lists them as
  confirmed, so restoring it is refused (it was a warning, and the batches were lost).

Every refused start is checked to have written nothing (no origin, no pin, no record, the
sink as it was), and every test ends with a run of the surviving lineage
(``restore=latest``) that leaves the sink exactly the input, once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, layout
from airflow_sparkpoint.services import savepoint as savepoints
from airflow_sparkpoint.services.commit import commit_pending
from tests.support.sink_cases import DeltaAppendCase, DeltaMergeCase, DirectoryCase, SinkCase
from tests.support.sink_races import Scene, differences, explain, write_inputs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

FIRST = range(6)
EXTERNAL = {"spark.sparkpoint.commit.mode": "external"}
RETAIN = {"spark.sparkpoint.checkpoint.numRetained": "10"}


def _first_lineage(scene: Scene, extra: dict[str, str] | None = None) -> tuple[Catalog, Any, Any]:
    """Batches 0-5 by the first run; returns the catalog, its checkpoint of batch 1 and
    a savepoint of batch 5 (from the latest checkpoint: the run has ended)."""
    write_inputs(scene.inputs, FIRST)
    first = scene.run("first", {**RETAIN, **(extra or {})})
    assert first.proc.returncode == 0, explain([first])
    catalog = scene.catalog()
    by_batch = {m.batch_id: m for m in catalog.checkpoints()}
    assert sorted(by_batch) == list(FIRST), explain([first], catalog)
    source = savepoints.savepoint_source(catalog, 60.0)
    _latest, savepoint = savepoints.savepoint_from_latest_checkpoint(catalog, source, refused_by=None)
    assert savepoint.metadata.batch_id == 5
    return catalog, by_batch, savepoint


def _external_lineage_committed_through_1(scene: Scene) -> tuple[Catalog, Any, Any]:
    """`_first_lineage` in external commit mode, the commit step run through batch 1:
    batches 2-5 confirmed and pending."""
    catalog, by_batch, savepoint = _first_lineage(scene, EXTERNAL)
    result = commit_pending(catalog, upto_batch=1, sink=scene.case.sink())
    assert len(result["committed"]) == 2, result
    return catalog, by_batch, savepoint


def _footprint(scene: Scene) -> tuple[list[str], list[str], list[dict[str, Any]]]:
    """What a refused start must not change: the origins and pins, the transaction
    records, the sink's rows."""
    catalog = scene.catalog()
    kept = [info.key for info in catalog.store.list("") if info.key.startswith((layout.LINEAGE, layout.PINS))]
    return kept, sorted(r.txn_id for r in catalog.transactions()), sorted(scene.case.rows(), key=str)


def _killed(driver: Any, point: str) -> None:
    assert driver.proc.returncode != 0, driver.tail()
    assert driver.fault_marker.read_text().strip() == point, \
        f"the fault {point} did not fire:\n{driver.tail()}"


def _refused(scene: Scene, name: str, extra: dict[str, str], because: str) -> None:
    before = _footprint(scene)
    refused = scene.run(name, extra)
    assert refused.proc.returncode != 0, (
        f"the restore was accepted although the sink does not hold its lineage's output:\n"
        f"{explain(scene.drivers, scene.catalog())}")
    assert "SinkLineageError" in refused.output and because in refused.output, refused.tail()
    assert _footprint(scene) == before, "the refused start changed the store or the sink"


def _rewound_to_own_commit(scene: Scene, name: str, extra: dict[str, str]) -> None:
    """A start that rewinds a merge table to the first lineage's own commit of batch 5."""
    from deltalake import DeltaTable

    own = [int(e["version"]) for e in DeltaTable(scene.case.output()).history()
           if e.get("sparkpoint.batch") == "5" and e.get("sparkpoint.generation") == "1"]
    assert len(own) == 1, own
    started = scene.run(name, extra)
    assert started.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    assert f"to {own[0]} (last committed batch 5)" in started.output, started.tail()


def _exact(scene: Scene) -> None:
    problems = differences(scene.case, scene.case_input(), scene.case.rows())
    assert not problems, "\n".join(problems[:20]) + "\n" + explain(scene.drivers, scene.catalog())


@pytest.fixture()
def scene_of(tmp_path: Path) -> Any:
    scenes: list[Scene] = []

    def make(case_cls: type[SinkCase]) -> Scene:
        scene = Scene(tmp_path, case_cls(tmp_path))
        scene.case_input = lambda: _input_rows(scene)  # type: ignore[attr-defined]
        scenes.append(scene)
        return scene

    yield make
    for scene in scenes:
        scene.stop()


def _input_rows(scene: Scene) -> list[dict[str, Any]]:
    import json

    return [json.loads(line) for path in sorted(scene.inputs.glob("events-*.json"))
            for line in path.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------- item 1


@pytest.mark.parametrize("policy", ["fail", pytest.param("rewind", marks=pytest.mark.slow)])
@pytest.mark.parametrize("snapshot", ["savepoint", pytest.param("checkpoint", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case_cls", [DeltaAppendCase, pytest.param(DeltaMergeCase, marks=pytest.mark.slow)],
                         ids=["delta-append", "delta-merge"])
def test_a_sink_rewound_by_another_lineage_refuses_a_restore_of_the_abandoned_lineage(
    scene_of: Any, case_cls: type[SinkCase], snapshot: str, policy: str
) -> None:
    scene = scene_of(case_cls)
    _catalog, by_batch, savepoint = _first_lineage(scene)
    # The second lineage: the table rewound to batch 1; with the savepoint, batch 2 is
    # committed before it dies (its checkpoint supersedes the first lineage's newer ones);
    # with the checkpoint, it dies before checkpointing batch 2 (they stay restorable).
    point = "committed:2" if snapshot == "savepoint" else "confirmed:2"
    second = scene.run("second",
                       {**RETAIN, "spark.sparkpoint.restore": scene.catalog().checkpoint_uri(by_batch[1].id),
                        "spark.sparkpoint.restore.sinkAhead": "rewind"}, fault=point)
    _killed(second, point)
    target = savepoint.uri if snapshot == "savepoint" else scene.catalog().checkpoint_uri(by_batch[5].id)

    restore = {"spark.sparkpoint.restore": target, "spark.sparkpoint.restore.sinkAhead": policy}
    if policy == "rewind" and case_cls.merge:
        # A merge's table files are its own and still there: the rewind brings back the
        # first lineage's commit of batch 5 (and undoes the second lineage's batch 2).
        _rewound_to_own_commit(scene, "third", restore)
    else:
        _refused(scene, "third", restore,
                 "would lose or mix output" if policy == "fail" else "of its files are gone")

    write_inputs(scene.inputs, range(6, 8))
    rest = scene.run("rest")
    assert rest.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


# ---------------------------------------------------------------------------- item 2


@pytest.mark.parametrize("case_cls", [pytest.param(DeltaAppendCase, marks=pytest.mark.slow), DeltaMergeCase],
                         ids=["delta-append", "delta-merge"])
def test_a_rewind_never_lands_on_another_lineages_commit(scene_of: Any, case_cls: type[SinkCase]) -> None:
    scene = scene_of(case_cls)
    _catalog, by_batch, savepoint = _first_lineage(scene)
    write_inputs(scene.inputs, range(6, 12))
    # The second lineage reads two files a batch: its batch 5 holds other files than the first's.
    second = scene.run("second",
                       {**RETAIN, "spark.sparkpoint.restore": scene.catalog().checkpoint_uri(by_batch[1].id),
                        "spark.sparkpoint.restore.sinkAhead": "rewind"}, args=["--max-files", "2"])
    assert second.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    assert (second.result or {}).get("last_batch") == 6, second.tail()

    rewind = {"spark.sparkpoint.restore": savepoint.uri, "spark.sparkpoint.restore.sinkAhead": "rewind"}
    if not case_cls.merge:
        # An append's table files are the staged ones, and the second run's recovery
        # discarded the first lineage's rewound-away files: no rewind brings them back.
        _refused(scene, "third", rewind, "of its files are gone")
    else:
        # A merge writes files of its own, still there: the rewind lands on the first
        # lineage's commit of batch 5 (it landed on the second lineage's).
        _rewound_to_own_commit(scene, "third", rewind)

    rest = scene.run("rest")
    assert rest.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


# ---------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("snapshot", ["savepoint", pytest.param("checkpoint", marks=pytest.mark.slow)])
@pytest.mark.parametrize("case_cls", [DirectoryCase, pytest.param(DeltaAppendCase, marks=pytest.mark.slow)],
                         ids=["directory", "delta-append"])
def test_a_snapshot_whose_confirmed_transactions_were_aborted_is_refused(
    scene_of: Any, case_cls: type[SinkCase], snapshot: str
) -> None:
    scene = scene_of(case_cls)
    catalog, by_batch, savepoint = _external_lineage_committed_through_1(scene)
    # The second lineage's recovery aborts the first lineage's batches 2-5 (its restart
    # point, batch 1, does not confirm them); it dies before staging its own batch 2.
    second = scene.run("second",
                       {**RETAIN, "spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[1].id)},
                       fault="stage:2")
    _killed(second, "stage:2")
    target = savepoint.uri if snapshot == "savepoint" else catalog.checkpoint_uri(by_batch[5].id)

    _refused(scene, "third", {"spark.sparkpoint.restore": target}, "was aborted since: its output is gone")

    retry = scene.run("retry")  # restore=latest: the second lineage, from batch 1
    assert retry.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


@pytest.mark.parametrize("case_cls", [DeltaAppendCase, pytest.param(DeltaMergeCase, marks=pytest.mark.slow)],
                         ids=["delta-append", "delta-merge"])
def test_a_rewind_that_needs_an_aborted_transaction_is_refused(
    scene_of: Any, case_cls: type[SinkCase]
) -> None:
    """Found by the simulation (20262201:3883): the first lineage confirmed batches 2-5
    and committed 0-1; the second lineage's recovery aborted 2-5 and it committed its own
    batch 2. A rewinding restore of the first lineage's savepoint must be refused before
    anything is written: a rewind to the first lineage's batch 1 would need its batches
    2-5, whose output is gone (the start rewound the table and was refused after). A
    directory sink cannot rewind: it is refused before this question."""
    scene = scene_of(case_cls)
    catalog, by_batch, savepoint = _external_lineage_committed_through_1(scene)
    second = scene.run("second",
                       {**RETAIN, "spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[1].id)},
                       fault="committed:2")
    _killed(second, "committed:2")

    _refused(scene, "third",
             {"spark.sparkpoint.restore": savepoint.uri, "spark.sparkpoint.restore.sinkAhead": "rewind"},
             "was aborted since: its output is gone")

    retry = scene.run("retry")  # restore=latest: the second lineage, from its batch 2
    assert retry.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


@pytest.mark.parametrize("case_cls", [DeltaAppendCase, pytest.param(DeltaMergeCase, marks=pytest.mark.slow)],
                         ids=["delta-append", "delta-merge"])
def test_a_rewind_past_a_rewound_away_commit_still_needs_the_aborted_batches_above_it(
        scene_of: Any, case_cls: type[SinkCase]) -> None:
    """Found by the simulation (20269106:1582): the first lineage confirmed batches 0-5 and
    the commit step committed 0-1; the second lineage restored its checkpoint of batch 0
    with ``restore.sinkAhead=rewind``: its recovery aborted 2-5 and it rewound the table
    to batch 0 (batch 1 rewound away). A rewinding restore of the first lineage's
    savepoint of batch 5 must be refused before anything is written: the rewind would
    bring batch 1 back, but batches 2-5 are aborted (the check stopped at batch 1, the
    start wrote its pin and origin, rewound the table and was refused after)."""
    scene = scene_of(case_cls)
    catalog, by_batch, savepoint = _external_lineage_committed_through_1(scene)
    second = scene.run("second",
                       {**RETAIN, "spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[0].id),
                        "spark.sparkpoint.restore.sinkAhead": "rewind"}, fault="rewind:0")
    _killed(second, "rewind:0")

    _refused(scene, "third",
             {"spark.sparkpoint.restore": savepoint.uri, "spark.sparkpoint.restore.sinkAhead": "rewind"},
             "was aborted since: its output is gone")

    retry = scene.run("retry")  # restore=latest: the second lineage, from batch 0
    assert retry.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


def test_an_abort_above_a_kept_transaction_refuses_the_start_before_it_writes(scene_of: Any) -> None:
    """Found by the simulation (20262202:2484): the first lineage confirmed batches 0-5 and
    committed none; the second lineage restored its checkpoint of batch 2, so its recovery
    keeps batches 0-2 and aborts 3-5, and it is killed right after deciding the abort of
    batch 3 (the first of three: its record is still there). A restore of the first
    lineage's checkpoint of batch 5 must be refused before anything is written: its batch
    3 is aborted although batch 0 is undecided (the check read only the first pending
    decision, and was refused after writing its pin and origin)."""
    scene = scene_of(DirectoryCase)
    catalog, by_batch, _savepoint = _first_lineage(scene, EXTERNAL)
    second = scene.run("second", {**RETAIN, **EXTERNAL,
                                  "spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[2].id)},
                       fault="recovery:3")
    _killed(second, "recovery:3")

    _refused(scene, "third", {"spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[5].id)},
             "was aborted since: its output is gone")

    retry = scene.run("retry")  # restore=latest: the second lineage, from batch 2
    assert retry.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)


# slow: four real drivers (about a minute); the simulation pins a shorter schedule of the
# same finding in the default run (`tests/simulation/test_found.py`, the moved savepoint one)
@pytest.mark.slow
def test_a_moved_savepoint_whose_confirmed_batches_another_lineage_rewound_away_is_refused(
        scene_of: Any, tmp_path: Path) -> None:
    """Found by the simulation (20261130:2705): the first lineage confirmed batches 0-5
    and the commit step committed them all; the second lineage restored the first one's
    checkpoint of batch 1 with ``restore.sinkAhead=rewind`` and rewound the table to batch 1. A copy of
    the first lineage's savepoint moved out of the job's root has no records beside it,
    so the check asked the sink only whether the abort of batches 2-5 was decided (no:
    they were committed, then rewound away) and the start was accepted: it failed
    committing batch 2, whose staged files the second lineage's recovery had discarded.
    It must be refused before anything is written."""
    import shutil

    scene = scene_of(DeltaAppendCase)
    catalog, by_batch, savepoint = _first_lineage(scene, EXTERNAL)
    result = commit_pending(catalog, sink=scene.case.sink())
    assert len(result["committed"]) == 6, result
    rewinding = {"spark.sparkpoint.restore": catalog.checkpoint_uri(by_batch[1].id),
                 "spark.sparkpoint.restore.sinkAhead": "rewind"}
    second = scene.run("second", {**RETAIN, **EXTERNAL, **rewinding}, fault="stage:2")
    _killed(second, "stage:2")
    moved = tmp_path / "moved-savepoint"
    shutil.copytree(savepoint.uri.removeprefix("file://"), moved)

    _refused(scene, "third", {"spark.sparkpoint.restore": str(moved)}, "no longer holds batch 2")

    retry = scene.run("retry")  # restore=latest: the second lineage, from batch 1
    assert retry.proc.returncode == 0, explain(scene.drivers, scene.catalog())
    _exact(scene)
