"""Exclusive promotion per batch (invariant 8) with two real drivers of one job.

S3 sinks run against moto over HTTP, and (``slow``) the S3Sink against SeaweedFS too.

A first driver (the *zombie*: a stalled try that Airflow gave up on, an old deploy) is
held at a pause point of batch 2's transaction; a newer generation starts from the
checkpoint of batch 1 (an operator's restore of an earlier checkpoint: a new lineage),
so it re-runs batch 2, and the input gained a file that sorts before the one the zombie
read: the re-run's batch 2 differs from the zombie's. Then the zombie is released. The
output must hold every input event exactly once (or the exact totals per user), checked
row by row against the input files; whatever the loser staged must be gone.

Windows:

* ``staged``: the zombie staged batch 2 and has not recorded it (between staging and
  promotion): the newer generation's recovery aborts the data, the zombie is fenced at
  its checkpoint;
* ``before_claim``: the zombie's checkpoint of batch 2 is complete and it passed the
  runtime's generation check; it is about to promote (between ``_metadata`` and
  promotion). It wakes before the re-run promotes batch 2, or after;
* ``promoted`` (file sinks): the zombie claimed batch 2 and its files are visible, the
  claim is not marked done: the claim is a commit, so the newer generation must not
  discard the files; it refuses the restore (the sink is ahead of it) instead, and the
  operator then restores the checkpoint the sink matches.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.race_drivers import TIMEOUT_S
from tests.support.s3_servers import S3Context
from tests.support.sink_cases import (
    DeltaAppendCase,
    DeltaMergeCase,
    DirectoryCase,
    DirectoryS3Case,
    S3Case,
    SinkCase,
)
from tests.support.sink_races import (
    JOB,
    Scene,
    differences,
    explain,
    odd_file,
    seaweedfs,
    write_inputs,
)
from tests.support.waits import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.timeout(2400)]

CASES: dict[str, type[SinkCase]] = {
    "delta-merge": DeltaMergeCase, "delta-append": DeltaAppendCase, "directory": DirectoryCase,
    "s3": S3Case, "directory-s3": DirectoryS3Case, "s3-seaweedfs": S3Case,
}
ON_S3 = {"s3", "directory-s3", "s3-seaweedfs"}
slow = pytest.mark.slow


def sink_param(name: str, *, default: bool = False) -> Any:
    marks = [] if default else [slow]
    if name in ON_S3:
        marks.append(pytest.mark.s3)
    return pytest.param(name, marks=marks, id=name)


@pytest.fixture(scope="module")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as endpoint:
        yield endpoint


@pytest.fixture()
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    name = request.node.callspec.params["sink"]
    s3 = None
    if name in ON_S3:
        import boto3

        server = "seaweedfs" if "seaweedfs" in name else "moto"
        endpoint = request.getfixturevalue("seaweedfs_endpoint" if server == "seaweedfs"
                                           else "s3_server_process")
        bucket = f"sp-race-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        s3 = S3Context(endpoint, bucket, server)
    scene = Scene(tmp_path, CASES[name](tmp_path, s3), work_dirs=True)
    try:
        yield scene
    finally:
        scene.stop()


@pytest.mark.parametrize("sink", [sink_param("delta-append"), sink_param("directory"), sink_param("s3")])
def test_a_zombie_held_between_staging_and_promotion_is_fenced_and_its_staging_discarded(
    scene: Scene, sink: str
) -> None:
    expected = write_inputs(scene.inputs, [0, 1, 2])
    zombie = scene.start("zombie", pause=("staged:2",))
    held = zombie.wait_for("staged")
    assert held is not None and held["batch"] == 2 and held["txn"] == f"{JOB}-b2-g1"

    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [3])
    rerun = scene.start("rerun", restore=scene.checkpoint_of(1))
    rerun_rc = rerun.wait()
    zombie.release("staged")
    zombie_rc = zombie.wait()

    assert rerun_rc == 0, explain(scene.drivers, scene.catalog())
    assert zombie_rc != 0 and "StaleGeneration" in zombie.output, zombie.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == [], "the zombie's staged data was not discarded"
    sink = scene.case.sink()
    committed = sink.committed_txn(JOB, 2)
    assert committed is not None and committed.generation == 2
    # The zombie recorded its transaction after the re-run had started: that record is
    # left for the next run, and it can never commit (nothing of it is staged either).
    assert all(not sink.is_committed(r) for r in scene.catalog().transactions())


BEFORE, AFTER = "before-the-rerun-promotes", "after-the-rerun-promoted"


def window_param(name: str, wakes: str, *, default: bool = False) -> Any:
    param = sink_param(name, default=default)
    return pytest.param(name, wakes, marks=param.marks, id=f"{name}-{wakes}")


@pytest.mark.parametrize(("sink", "wakes"), [
    window_param("delta-merge", BEFORE, default=True), window_param("delta-merge", AFTER),
    window_param("delta-append", BEFORE), window_param("delta-append", AFTER),
    window_param("directory", BEFORE), window_param("directory", AFTER),
    window_param("s3", BEFORE), window_param("s3", AFTER),
    window_param("directory-s3", BEFORE), window_param("directory-s3", AFTER),
    window_param("s3-seaweedfs", AFTER),
])
def test_a_zombie_held_before_its_claim_loses_the_batch_to_the_rerun(
    scene: Scene, sink: str, wakes: str
) -> None:
    expected = write_inputs(scene.inputs, [0, 1, 2])
    zombie = scene.start("zombie", pause=("before_claim:2",))
    held = zombie.wait_for("before_claim")
    assert held is not None and held["batch"] == 2 and held["txn"] == f"{JOB}-b2-g1"

    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [3])
    early = wakes == BEFORE
    rerun = scene.start("rerun", restore=scene.checkpoint_of(1), pause=("before_claim:2",) if early else ())
    if early:
        again = rerun.wait_for("before_claim")  # its recovery has aborted the zombie's transaction
        assert again is not None and again["txn"] == f"{JOB}-b2-g2"
        zombie.release("before_claim")
        zombie_rc = zombie.wait()
        rerun.release("before_claim")
        rerun_rc = rerun.wait()
    else:
        rerun_rc = rerun.wait()
        zombie.release("before_claim")
        zombie_rc = zombie.wait()

    # Every exit code before the output: a re-run that failed after some batches leaves
    # output that only looks like a loss (issue #27.5).
    assert rerun_rc == 0, explain(scene.drivers, scene.catalog())
    assert zombie_rc != 0, zombie.tail()
    assert ("TransactionConflict" if not early else "was aborted") in zombie.output, zombie.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == [], "the losing transaction's staged data was not discarded"
    committed = scene.case.sink().committed_txn(JOB, 2)
    assert committed is not None and committed.generation == 2 and committed.txn_id == f"{JOB}-b2-g2"
    assert scene.catalog().transactions() == []


@pytest.mark.parametrize("sink",
                         [sink_param("s3"), sink_param("directory", default=True), sink_param("directory-s3"),
                          sink_param("s3-seaweedfs")])
def test_a_zombie_holding_the_claim_makes_the_restore_refuse_instead_of_losing_the_batch(
    scene: Scene, sink: str
) -> None:
    expected = write_inputs(scene.inputs, [0, 1, 2])
    zombie = scene.start("zombie", pause=("promoted:2",))
    held = zombie.wait_for("promoted")
    assert held is not None and held["batch"] == 2
    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [3])

    restore = scene.start("restore", restore=scene.checkpoint_of(1), pause=("before_claim:2",))
    restore_held = restore.wait_for("before_claim", or_exit=True)
    zombie.release("promoted")
    zombie_rc = zombie.wait()
    if restore_held is not None:
        restore.release("before_claim")
    restore_rc = restore.wait()
    # The operator's way out: restore the checkpoint that matches what the sink holds.
    position = scene.case.sink().committed_position(JOB)
    assert position is not None
    fixed = scene.start("fixed", restore=scene.checkpoint_of(position))
    fixed_rc = fixed.wait()

    assert restore_held is None and restore_rc != 0, "the restore behind the zombie's claim must be refused"
    # Refused before it claimed a generation: the zombie was never superseded.
    assert zombie_rc == 0, explain(scene.drivers, scene.catalog())
    assert fixed_rc == 0, explain(scene.drivers, scene.catalog())
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == []
    # The claim counts as a commit of batch 2: the sink is ahead of the restore point
    # (or, had the claim come between that check and the recovery, the zombie's
    # transaction cannot be aborted).
    assert ("has already committed batch 2 of job 'race', past the restore point" in restore.output
            or f"transaction {JOB}-b2-g1 has committed" in restore.output), restore.tail()
    assert position == 2
    committed = scene.case.sink().committed_txn(JOB, 2)
    assert committed is not None and committed.txn_id == f"{JOB}-b2-g1"


@pytest.mark.parametrize("sink", [sink_param("delta-merge", default=True), sink_param("directory"),
                                  sink_param("s3")])
def test_a_zombie_waking_while_the_rerun_prepares_cannot_land_a_batch_past_the_restart_point(
    scene: Scene, sink: str
) -> None:
    """The zombie passed its generation check and is about to promote batch 2 when the
    re-run (from the checkpoint of batch 1) has checked the sink's position and is still
    building its live location: the zombie must not land batch 2 then (the re-run would
    take the sink's batch 2 as its own, although its batch 2 read other input)."""
    expected = write_inputs(scene.inputs, [0, 1, 2])
    zombie = scene.start("zombie", pause=("before_claim:2",))
    held = zombie.wait_for("before_claim")
    assert held is not None and held["batch"] == 2 and held["txn"] == f"{JOB}-b2-g1"

    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [3])
    rerun = scene.start("rerun", restore=scene.checkpoint_of(1), pause=("before_live",))
    prepared = rerun.wait_for("before_live")
    assert prepared is not None and prepared["batch"] == 1 and prepared["generation"] == 2
    zombie.release("before_claim")
    zombie_rc = zombie.wait()
    rerun.release("before_live")
    rerun_rc = rerun.wait()

    assert rerun_rc == 0, explain(scene.drivers, scene.catalog())
    assert zombie_rc != 0 and "was aborted" in zombie.output, zombie.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == [], "the zombie's staged data was not discarded"
    committed = scene.case.sink().committed_txn(JOB, 2)
    assert committed is not None and committed.txn_id == f"{JOB}-b2-g2"
    assert scene.catalog().transactions() == []


@pytest.mark.parametrize("sink", [sink_param("delta-merge", default=True), sink_param("delta-append")])
def test_a_stalled_first_commit_does_not_write_batch_0_again_into_the_table_the_retry_created(
    scene: Scene, sink: str
) -> None:
    """Issue #27.1: the first try decided to promote batch 0 of a table that did not exist
    yet and stalled (``claimed``); the retry restores the checkpoint of batch 0, whose
    recovery commits the same transaction (it is decided), creating the table, and is held
    before it removes the staged files (``landed``); then the first try wakes."""
    expected = write_inputs(scene.inputs, [0, 1, 2])
    first = scene.start("first", pause=("claimed:0",))
    held = first.wait_for("claimed")
    assert held is not None and held["batch"] == 0 and held["txn"] == f"{JOB}-b0-g1"
    assert scene.case.sink().committed_position(JOB) is None, "no table yet"

    retry = scene.start("retry", pause=("landed:0",))
    landed = retry.wait_for("landed")  # its recovery created the table with the first try's batch 0
    assert landed is not None and landed["txn"] == f"{JOB}-b0-g1"
    first.release("claimed")
    first_rc = first.wait()
    retry.release("landed")
    retry_rc = retry.wait()

    assert retry_rc == 0, explain(scene.drivers, scene.catalog())
    # superseded: fenced at its next act, not failed for another reason (issue #45 item 8)
    assert first_rc != 0 and "StaleGeneration" in first.output, first.tail()
    assert "TransactionConflict" not in first.output, first.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == []
    from deltalake import DeltaTable

    commits = [e for e in DeltaTable(scene.case.output()).history() if e.get("sparkpoint.batch") == "0"]
    assert [e.get("sparkpoint.txn") for e in commits] == [f"{JOB}-b0-g1"], commits


@pytest.mark.parametrize("sink", [sink_param("delta-merge", default=True), sink_param("directory")])
# "stage" is slow: the default run is at its 40-minute budget
@pytest.mark.parametrize("point", [pytest.param("stage", marks=slow), "recorded"])
def test_a_rerun_held_before_its_last_batch_while_the_one_before_commits_ends_with_every_batch(
    scene: Scene, sink: str, point: str
) -> None:
    """Issue #27.5, the deterministic version of a CI failure of the ``before_claim``
    test above (delta-merge, the zombie woken before the re-run promotes): the re-run,
    held at ``before_claim:2`` while the zombie lost, is then held at batch 4 (``stage``:
    before staging; ``recorded``: staged and recorded, Spark's commit not written) until
    batch 3 is checkpointed and committed; released, it must end with every batch."""
    expected = write_inputs(scene.inputs, [0, 1, 2])
    zombie = scene.start("zombie", pause=("before_claim:2",))
    held = zombie.wait_for("before_claim")
    assert held is not None and held["batch"] == 2 and held["txn"] == f"{JOB}-b2-g1"

    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [3])
    rerun = scene.start("rerun", restore=scene.checkpoint_of(1), pause=("before_claim:2", f"{point}:4"))
    again = rerun.wait_for("before_claim")
    assert again is not None and again["txn"] == f"{JOB}-b2-g2"
    zombie.release("before_claim")
    zombie_rc = zombie.wait()
    rerun.release("before_claim")
    last = rerun.wait_for(point)
    assert last is not None and last["batch"] == 4
    sink_now = scene.case.sink()

    def batch_3_done() -> bool:
        return (sink_now.committed_position(JOB) == 3
                and any(m.batch_id == 3 for m in scene.catalog().checkpoints()))

    # The coordinator goes on while Spark is held in batch 4.
    wait_for("the re-run to checkpoint and commit batch 3", batch_3_done, TIMEOUT_S, rerun.tail,
             proc=rerun.proc)
    rerun.release(point)
    rerun_rc = rerun.wait()

    assert zombie_rc != 0 and "was aborted" in zombie.output, zombie.tail()
    assert rerun_rc == 0, explain(scene.drivers, scene.catalog())
    result = rerun.result
    assert result is not None and result["status"] == "finished" and result["last_batch"] == 4, result
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    assert scene.case.leftovers(JOB) == []
    assert scene.case.sink().committed_position(JOB) == 4
    assert scene.catalog().transactions() == []
