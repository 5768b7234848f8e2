"""What the exploration (and, where said, a review) found (issue #45), pinned: each schedule below is the
shrunk schedule of a violation on the code before its fix, replayed step for step by a
`ScriptedChooser` (the directives and restore choices the exploration drew). On the fixed
code each one ends without a violation; on the code before, each one failed with the
message quoted in its docstring.

Restore choices index `actors._snapshots`: the complete checkpoints in id order (chk-1 is
the first batch's), then the savepoints.
"""

from __future__ import annotations

import pytest

from tests.simulation.actors import DriverSpec
from tests.simulation.scheduler import Pause, ScriptedChooser
from tests.simulation.simulate import ActorSpec, Schedule, run_schedule


def _driver(**settings: object) -> ActorSpec:
    return ActorSpec("driver", DriverSpec(**settings))  # type: ignore[arg-type]


def test_item_1_and_3_a_restore_of_the_abandoned_lineage_whose_confirmed_batches_were_aborted() -> None:
    """Found by the family `across_lineages` (directory sink): "the sink holds batches
    [0, 2, 3, 4]; expected [0, 1, 2, 3, 4] (missing [1])" with "transaction sim-b1-g1
    listed by …/chk-2 was aborted since; not committing it". a2 restores the checkpoint of
    batch 0 by path, its recovery aborts the first lineage's batches 1 and 2 (external
    mode: confirmed, not committed), and it dies before staging its own batch 1; a3
    restores the first lineage's checkpoint of batch 1 by path. Fixed: a3 is refused
    before anything is written; the retry continues a2's lineage."""
    schedule = Schedule("directory", 5, (
        _driver(budget=3, num_retained=6, commit_mode="external"),
        ActorSpec("savepoint"),
        _driver(restore="path", budget=1, num_retained=6),
        _driver(restore="path", budget=1, num_retained=6),
    ))
    run_schedule(schedule, ScriptedChooser([Pause("a2", ("sink.stage",), crash=True)], options=[0, 1]))


def test_item_2_a_rewind_to_the_savepoint_of_an_abandoned_lineage() -> None:
    """Found by the family `rewinds` (Delta): "the sink's rows are not one lineage's
    output of the input … batch 3 … sum 166" after "rewound Delta table … from version 7
    to 5 (last committed batch 2)": version 5 was a2's commit of batch 2, not the first
    lineage's, whose savepoint a3 restored. Fixed: the rewind targets the first lineage's
    own commit, whose files a2's recovery discarded, so a3 is refused before anything is
    written; the retry continues a2's lineage."""
    schedule = Schedule("delta", 5, (
        _driver(budget=3, num_retained=6),
        ActorSpec("savepoint"),
        _driver(restore="path", sink_ahead="rewind", version=2, budget=4, num_retained=6),
        _driver(restore="path", sink_ahead="rewind", budget=1, num_retained=6),
    ))
    run_schedule(schedule, ScriptedChooser([], options=[0, -1]))


def test_item_4_the_commit_step_between_a_claim_and_its_origin() -> None:
    """Found by the family `commit_step_races`: "the sink holds batches [0, 1, 3, 4, 5];
    expected [0, 1, 2, 3, 4, 5] (missing [2])". a1 claimed its generation (a restore by
    path of the checkpoint of batch 1) and the step read the fence, then the origins
    (without a1's), then a1 wrote its origin, aborted the first lineage's batches 2 and 3
    and recorded its own batch 2, then the step read the records: a1's batch 2 was at or
    below the old lineage's latest and unlisted there, and the step aborted it. Fixed:
    the step reads the records first, and settles nothing while the newest generation
    has no origin."""
    schedule = Schedule("directory", 6, (
        _driver(budget=4, num_retained=6, commit_mode="external"),
        _driver(restore="path", budget=2, num_retained=6, commit_mode="external"),
        ActorSpec("commit"),
    ))
    run_schedule(schedule, ScriptedChooser(
        [Pause("a1", ("put_if_absent sim/lineage/",), "a2", ("list sim/lineage/",)),
         Pause("a1", ("put_if_absent sim/chk-",), "a2")],  # a1 has recorded batch 2; the step goes on
        options=[1]))


def test_a_rollback_of_a_stalled_live_generation() -> None:
    """Found by the generic exploration: "the sink holds batches [1, 2, 3]; expected
    [0, 1, 2, 3] (missing [0])". a0's heartbeat was 91 s old (it stalled), so the rollback
    took it for stopped, aborted its recorded batch 0 and retired its checkpoints; a0 went
    on, checkpointed batch 0 without it (in external mode the aborted record had left the
    pending set) and the batch was lost. Fixed: the rollback of the newest generation
    claims the next one (a0 fails at its next act) and returns the lineage to where a0
    started."""
    schedule = Schedule("delta", 4, (
        _driver(restore="none", version=2, budget=2, sink_ahead="rewind", commit_mode="external"),
        ActorSpec("rollback"),
    ))
    run_schedule(schedule, ScriptedChooser(
        [Pause("a0", ("fault record",), "a1"),  # a0 recorded batch 0; the rollback runs now
         Pause("a1", ("get sim/status",), stall=True)],  # ... 90 s after a0's last heartbeat
        options=[0]))


def test_item_6_savepoint_retention_beside_a_restore_of_a_savepoint() -> None:
    """Savepoint history retention read the origins (a3's was not written yet), so it did
    not count a3's savepoint as relied on, and disposed of it after a3 wrote its origin;
    a3 died before a checkpoint of its own (nothing was left to read): "a retry with
    restore=latest after this schedule did not resume the job: RestoreError: restore
    target …/savepoint-3-… has no _metadata; … it is where the lineage of generation 2
    started". Fixed: a savepoint of the job restored by path is pinned before the origin,
    and a lineage whose origin snapshot is gone restarts from its pin."""
    schedule = Schedule("directory", 5, (
        _driver(budget=3, num_retained=6), ActorSpec("savepoint"), ActorSpec("savepoint"),
        _driver(restore="path", budget=1, num_retained=6), ActorSpec("retention", keep=1),
    ))
    run_schedule(schedule, ScriptedChooser(
        [Pause("a3", ("put_if_absent sim/lineage/",), "a4", ("list sim/lineage/",)),
         Pause("a3", ("put_if_absent sim/chk-",), crash=True)],
        options=[4]))  # the older of the two savepoints (retention keeps the newest)


def test_a_stalled_recovery_never_cleans_up_a_newer_generations_staging() -> None:
    """Found by the family `savepoint_retention_races`: "a retry with restore=latest after
    this schedule did not resume the job: SinkError: transaction sim-b0-g2 was aborted".
    a0's start stalled in its recovery's clean-up of staged data no record names (its
    fence check had passed); a1 started, staged and recorded batch 0 (external mode) and
    checkpointed it; a0's clean-up then went on, took a1's staging for an orphan, decided
    its abort and deleted it: a1's confirmed batch 0 was lost. Fixed: the clean-up keeps
    everything recorded when it runs and never touches a newer generation's staging."""
    schedule = Schedule("directory", 4, (
        _driver(budget=3, num_retained=6),
        _driver(budget=1, num_retained=6, commit_mode="external"),
    ))
    run_schedule(schedule, ScriptedChooser([Pause("a0", ("sink.cleanup_orphans",), "a1")]))


def test_a_commit_step_whose_claim_lost_to_a_newer_lineage_reads_again() -> None:
    """Found by the long exploration (seed 20261129, schedule 6061): "a1-commit failed
    unexpectedly: TransactionConflict: batch 0 of job 'sim' was already committed … by
    transaction 'sim-b0-g2'". The step checked its fence and stalled before its sink
    commit of the first run's batch 0 (external mode); a second run with restore=none
    claimed generation 2 and committed its own batch 0; the step's commit then lost the
    batch. Nothing was lost (the first lineage was abandoned), but the step failed with the
    loss error. Fixed: a conflict met after a newer generation was claimed is that
    generation's, not a loss: the step reads the catalog again."""
    schedule = Schedule("directory", 5, (
        _driver(budget=3, sink_ahead="rewind", commit_mode="external", num_retained=6),
        ActorSpec("commit"),
        _driver(restore="none", version=2, budget=4, interval_s=5.0, num_retained=2),
    ))
    run_schedule(schedule, ScriptedChooser([
        Pause("a2", ("put_if_absent sim/chk-",), "a1", ("delete sim/chk-",)),
        Pause("a1", ("sink.commit", "sink.rewind", "_sparkpoint/decisions/"), "a2", occurrence=2, stall=True),
        Pause("a2", ("put_if_absent sim/chk-",), "a1", ("put_if_absent sim/chk-",), occurrence=2, crash=True),
    ]))


def test_a_commit_step_stalled_past_a_rollback_of_its_generation_reads_again() -> None:
    """Found by the long exploration (seed 20261131, schedules 4799 and 5866): "a1-commit
    failed unexpectedly: SinkError: transaction sim-b0-g1 was aborted (decision at …)".
    The step checked its fence and stalled before committing the first run's batch 0; a
    rollback of that run claimed generation 2 and decided the abort; the step's commit was
    then refused. Fixed: a commit refused after a newer generation was claimed makes the
    step read the catalog again (it then has nothing of generation 1 left to commit)."""
    schedule = Schedule("directory", 5, (
        _driver(budget=1, sink_ahead="rewind", commit_mode="external", interval_s=5.0, version=2),
        ActorSpec("commit"),
        ActorSpec("rollback"),
        _driver(restore="path", version=2, budget=5, sink_ahead="rewind", commit_mode="external",
                timeout_s=30.0, num_retained=6),
    ))
    run_schedule(schedule, ScriptedChooser([
        Pause("a3", ("delete sim/pins/",), "a1", ("delete sim/pins/",)),
        Pause("a1", ("sink.commit", "sink.rewind", "_sparkpoint/decisions/"), "a2"),
    ]))


def test_a_start_superseded_while_it_recovered_is_stale_not_refused() -> None:
    """Found by `make explore` at 20262004:3381 (Delta): "a2-driver was refused but changed
    [its pin, …]". a2 restored chk-3 by path, wrote its pin and origin, and stalled in its
    recovery; two newer generations started and one committed batch 2 of its own lineage;
    a2's position check then refused it with `SinkLineageError` ("holds batch 2 of another
    lineage") although a2 was superseded: the newer generation's output is the reason.
    Fixed: a refusal of the position check after the origin checks the fence first, so a
    superseded start ends with `StaleGeneration`. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20262004, 3381)
    run_schedule(schedule, chooser)


def test_a_rewind_that_needs_an_aborted_transaction_is_refused_before_anything_is_written() -> None:
    """Found by `make explore` at 20262201:3883 (Delta, external commit mode): "a4-driver
    was refused but changed [its pin, …]". Generation 1 confirmed batches 2-3 and only
    committed 0-1; a restore of batch 1 (generation 2) aborted them and committed its own
    batch 2; a4 restored generation 1's savepoint of batch 3 by path with
    ``restore.sinkAhead=rewind``. The check before writing stopped at the first
    divergence (batch 2 is generation 2's: rewindable), a4 wrote its pin and origin,
    rewound the table (generation 2's batch 2 undone), and its recovery then found batch 2
    of its own lineage aborted. Fixed: a rewindable divergence is accepted only when
    every pending transaction the rewound lineage still has to commit can be committed,
    so the start is refused before anything is written. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20262201, 3883)
    run_schedule(schedule, chooser)


def test_an_abort_above_a_kept_transaction_refuses_the_start_before_it_writes() -> None:
    """Found by `make explore` at 20262202:2484 (directory sink, external commit mode):
    "a3-driver was refused but changed [its pin, …]". Another lineage's recovery (a1,
    restored from generation 1's batch 0) kept batch 0 (its restart point confirms it),
    decided to abort batch 1, and stalled before deleting the record of batch 1; a3
    restored generation 1's checkpoint of batch 3 by path. Its check read only the first
    pending transaction's decision ("aborts go in batch order, so the first one tells"),
    found batch 0 undecided and stopped; a3 wrote its pin and origin and was refused after.
    Fixed: every pending transaction's decision is read. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20262202, 2484)
    run_schedule(schedule, chooser)


def test_a_rollback_retried_while_its_first_try_runs_fences_it() -> None:
    """Found by `make explore` at 20262602:1518 (and 20262601:3710): "a1-rollback failed
    unexpectedly: ObjectExists: …/pins/000000000002/_metadata already exists". Two
    rollbacks of one generation: the second took the first's claim (``rollback_of``) for a
    dead try's and went on under its fence, writing the pin and origin the first was about
    to write. Fixed: a retry goes on under an earlier try's claim only once that claim's
    origin is written (what is left is idempotent aborts); before, it fences the earlier
    try with a claim of its own. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20262602, 1518)
    run_schedule(schedule, chooser)


def test_an_abort_decided_by_a_fenced_run_keeps_its_record_and_is_never_committed_past() -> None:
    """Found by `make explore` at 20262810:376 (directory sink, external commit mode):
    "the sink holds batches [1, …, 7]; expected [0, …, 7]": batch 0 lost, silently.
    a3 (generation 2, from empty state) passed its fence check in its recovery and stalled
    before aborting generation 1's confirmed batch 0; a4 (generation 3) restored
    generation 1's checkpoint of batch 1 by path, passed its checks and its recovery
    (no abort decided yet) and ran on; a3 then decided the abort and deleted the record,
    and the commit step committed batch 1 and on past the missing batch 0. Fixed: a
    settler checks its fence again before it deletes an aborted record, so the record
    stays with its abort decision and the commit of batch 0 (and everything after it) is
    refused loudly: the lineage waits for a person's restore, as PROTOCOL.md's windows
    say. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20262810, 376)
    run_schedule(schedule, chooser)


def test_a_rewind_past_a_rewound_away_commit_still_needs_every_later_pending_transaction() -> None:
    """Found by `make explore` at 20269106:1582 (Delta merge, external commit mode):
    "a3-driver was refused but changed [its pin, …]". Generation 1 committed batches 0-1
    and confirmed batch 2 (its checkpoint of batch 2 lists both 1 and 2 as pending); a
    restore of its batch 0 (generation 2) aborted batch 2 and rewound the table to batch 0;
    a3 restored generation 1's checkpoint of batch 2 by path with
    ``restore.sinkAhead=rewind``. The check before writing found batch 1 rewound away
    (rewindable) and, looking for a pending transaction the rewind could not bring back,
    stopped at that same batch 1 instead of reading on to batch 2, aborted since; a3
    wrote its pin and origin, rewound the table and was refused after. Fixed: every
    pending transaction the rewind leaves to commit is read, and one aborted since refuses
    the start before anything is written. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20269106, 1582)
    run_schedule(schedule, chooser)


def test_a_rollback_keeps_a_batch_whose_promotion_is_decided() -> None:
    """Found by `make explore` at 20269802:2210 (directory sink): "a retry with
    restore=latest after this schedule did not resume the job: SinkAheadError: … has
    already committed batch 0 … past the restore point (empty state)". Generation 1
    decided to promote batch 0 and died before the files landed; a rollback of
    generation 1 counted batch 0 as uncommitted (`is_committed`: not landed yet) and
    returned the lineage to empty state, but a decided promotion stands (the abort
    finishes it), so batch 0 landed and every later start from empty state found the
    sink ahead with no replay record. Fixed: the rollback counts a transaction whose
    promotion is decided as committed. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20269802, 2210)
    run_schedule(schedule, chooser)


def test_a_zombies_damaged_checkpoint_is_not_the_new_lineages_own() -> None:
    """Found by `make explore` at 20269941:2016 (directory sink, external commit mode): "a
    retry with restore=latest after this schedule did not resume the job: RestoreError: …
    the lineage of generation 3 started from empty state and its checkpoints are damaged
    … chk-1: referenced file shared/metadata~… is missing". Generation 1 stalled inside
    its checkpoint 1 after uploading its files; generation 2 ran, wrote checkpoints 1 and
    2, and its retention removed checkpoint 1 and the first generation's orphaned upload;
    generation 1 woke, wrote ``chk-1/_metadata`` into the freed id (pointing at the
    removed file) and found itself fenced; a rollback of generation 2 returned the lineage
    to empty state (generation 3). Every ``restore=latest`` then took the zombie's
    damaged checkpoint for one of generation 3's own and refused. Fixed: a damaged
    checkpoint whose ``_metadata`` names a generation an origin abandoned is superseded,
    like a valid one. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20269941, 2016)
    run_schedule(schedule, chooser)


def test_the_commit_step_takes_a_zombies_late_checkpoint_at_or_below_a_savepoint_lineages_base() -> None:
    """Fails on 4c4e375 (and before it): "a retry with restore=latest after this
    schedule did not resume the job", every restore refused with "transaction sim-b4-g2
    (batch 4), which …/savepoint-6-… lists as confirmed, was aborted since". a0
    (generation 1, external mode) checkpoints batches 0..3 (chk-1..4), uploads its files
    of batch 4 and waits before its ``_metadata`` of chk-5 (its fence check passed). a1
    (2) restores chk-4, checkpoints chk-5 (batch 4) and chk-6 (batch 5), its retention
    (numRetained=1; its rollback point is its base chk-4) deleting chk-5; it serves a2's
    savepoint S (a copy of chk-6: pending batches 4 and 5 of generation 2) and
    checkpoints chk-7. a3 (3) restores chk-7, checkpoints chk-8; its retention deletes
    chk-4 and prunes generation 2's origin (it supersedes nothing left). a0 wakes:
    ``put_if_absent(chk-5/_metadata)`` lands in the id a1's retention freed, its files
    still there: a valid checkpoint of generation 1 (batch 4) that no origin supersedes.
    a4 (4) restores S by path (origin: savepoint, base 6: chk-7 and chk-8 superseded,
    chk-5 not), keeps S's pending transactions for the commit step and dies at its first
    stage. a5, the commit step: ``latest()`` is generation 1's chk-5, which does not list
    generation 2's batch 4, at or below its batch 4: aborted, though a4's restart point
    (S) confirms it. Batch 4's output is lost and no snapshot can be restored any more.
    """
    schedule = Schedule("directory", 8, (
        _driver(budget=5, num_retained=6, commit_mode="external"),
        _driver(budget=3, num_retained=1, commit_mode="external"),
        ActorSpec("savepoint"),
        _driver(budget=1, num_retained=1, commit_mode="external"),
        _driver(restore="path", budget=1, num_retained=6, commit_mode="external"),
        ActorSpec("commit"),
    ))
    run_schedule(schedule, ScriptedChooser([
        Pause("a0", ("put_if_absent sim/chk-",), "a3", occurrence=5),
        Pause("a1", ("put_if_absent sim/chk-",), "a2", ("put_if_absent sim/control/",), occurrence=2),
        Pause("a4", ("sink.stage",), crash=True),
    ], options=[3]))


def test_a_start_fenced_during_its_sink_check_ends_stale_not_refused() -> None:
    """Found by `make explore` at 20474703:2267 (Delta): "a4-driver was refused but
    changed ['store:copy sim/pins/000000000003/…']". a4 (generation 3) restores a
    savepoint by path, writes its pin and origin and starts its recovery; a5 (generation
    4, ``sinkAhead=rewind``) restores chk-1, rewinds the table to batch 0 and its recovery
    aborts the batches of the savepoint's lineage; a4, fenced by then, found one of those
    batches "aborted since" and raised `SinkLineageError` (a refusal asking a person to
    restore another snapshot, after its writes) instead of ending as a stale generation:
    the abort it read was the newer generation's, not damage of its snapshot. Fixed: the
    recovery checks its fence before it reports a batch aborted since. Replayed from its
    seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20474703, 2267)
    run_schedule(schedule, chooser)


def test_two_cutovers_left_open_by_dead_orchestrators_are_both_called_off() -> None:
    """Found by `make explore` at 20297413:1544 (directory sink): "a retry with
    restore=latest after this schedule did not resume the job: CutoverInProgress: job
    'sim' is in zero-downtime cutover … (planned, blue generation 1)". a2 plans a cutover,
    files blue's stop_after and dies (fault ``cutover_agreement``); a1 plans a second one,
    finds a2's open and dies before it ends its own (a planner that finds another open
    plan ends its own: it died first). Two cutovers stay open, as the protocol says of a
    dead orchestrator's until someone calls it off; the harness called off only the newest
    one, and the retry was refused by the other. Fixed in the harness: every open cutover
    not decided for green is called off before the retry. Replayed from its seed and
    index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20297413, 1544)
    run_schedule(schedule, chooser)


def test_a_rollback_of_a_generation_a_moved_copy_continues_is_refused() -> None:
    """Found by the exploration of the simulation's moved restores at 20297413:1686
    (Delta, on e27d5d6): a2 restored a copy of generation 1's savepoint moved out of the
    root (no pin, no base in the root); a4's rollback of generation 1 read only the root's
    checkpoints and the origins' bases, aborted the batches the copy confirms, and the
    retry's restart failed with "was aborted since". Fixed: the rollback reads the moved
    copy and refuses. Replayed from its seed and index."""
    from tests.simulation.explore import random_run

    schedule, chooser = random_run(20297413, 1686)
    run_schedule(schedule, chooser)


@pytest.mark.parametrize("commit_mode", ["external", "checkpoint"])
@pytest.mark.parametrize("sink", ["delta", "delta-merge"])
def test_a_moved_savepoint_whose_pending_batch_another_lineage_rewound_away(
        sink: str, commit_mode: str) -> None:
    """Found by a fresh seed at 20261130:2705 (Delta merge; a cutover and a race on
    ``shared/`` beside it, neither needed): "a retry with restore=latest after this schedule
    did not resume the job: SinkLineageError: sink … no longer holds batch 2 (sim-b2-g1),
    which the lineage of …/chk-5 committed". a1 savepoints the first lineage at batch 2
    (sim-b2-g1 pending in it, committed after); a2 restores the checkpoint of batch 1 by
    path, rewinds the table below batch 2 and leaves its own batch 2 pending (external);
    a3 restores a moved copy of the savepoint. With no records in the copy's root, the
    lineage check asked the sink only whether sim-b2-g1's abort was decided, not whether
    it had landed and been undone: a3 started on a table without batch 2 (in checkpoint
    mode it failed committing it: "staged files of this transaction are gone"), and its
    checkpoint lists the batch as pending. Fixed: the sink's own history says a pending
    transaction was rewound away, so a3 is refused (``fail``) or rewinds to the first
    lineage's own commit of batch 2 (a merge's files are still there; an append's were
    discarded by a2, so it is refused)."""
    schedule = Schedule(sink, 3, (
        _driver(budget=3, num_retained=6),
        ActorSpec("savepoint"),
        _driver(restore="path", sink_ahead="rewind", commit_mode="external", budget=2, num_retained=6),
        _driver(restore="moved", sink_ahead="rewind", commit_mode=commit_mode, budget=1, num_retained=6),
    ))
    run_schedule(schedule, ScriptedChooser([], options=[1, 0]))  # chk-2 (batch 1), the savepoint


@pytest.mark.parametrize("live", [True, False], ids=["g2-running", "g2-crashed"])
def test_a_rollback_of_a_generation_an_in_root_savepoint_lineage_continues_is_refused(live: bool) -> None:
    """Found by a review (helper-60, 2026-11-30; directory sink, external mode): a1
    savepoints the first lineage at batch 1 (batches 0 and 1 pending in it), and the first
    lineage's retention (numRetained=1) deletes the savepoint's source checkpoint; a2
    restores the savepoint by path (a savepoint origin in the root, with a pin) and stops
    before its first checkpoint, while a3 rolls back generation 1. The rollback looked
    for a newer lineage only among the root's checkpoints and the origins' bases (gone)
    and outside the root, so it aborted batches 0 and 1, which the savepoint confirms.
    Running: a2 forgot them and the commit step committed its later batches ("the sink
    holds batches [2, 3, 4, 5]; expected [0, 1, 2, 3, 4, 5] (missing [0, 1])"). Crashed:
    every restart of a2's lineage was refused ("sim-b0-g1 … lists as confirmed, was
    aborted since"), which the schedule's end accepts (a person restores another point),
    so the test asserts the rollback's refusal too. Fixed: the rollback reads every newer
    origin's start point and refuses."""
    schedule = Schedule("directory", 6, (
        _driver(budget=4, num_retained=1, commit_mode="external"),
        ActorSpec("savepoint"),
        _driver(restore="path", budget=2, num_retained=1, commit_mode="external"),
        ActorSpec("rollback"),
        ActorSpec("commit"),
    ))
    pauses = [
        # a0 holds before staging batch 2 until the savepoint has copied its checkpoint of batch 1
        Pause("a0", ("sink.stage",), "a1", ("put_if_absent sim/control/",), occurrence=2),
        # a2 (recovered, its first batch staged) holds before its first checkpoint until the
        # rollback ended, or dies there
        Pause("a2", ("put_if_absent sim/chk-",), "a3") if live else Pause("a2", ("put_if_absent sim/chk-",),
                                                                          crash=True),
    ]
    outcome = run_schedule(schedule, ScriptedChooser(pauses, options=[-1, 0]))  # the savepoint; generation 1
    # crashed, the old code's loss showed only as refused restarts, which a person repairs
    refused = [line for line in outcome.trace if "a3-rollback raised RestoreError" in line]
    assert refused and "restores its lineage: a newer run continues it" in refused[0], \
        [line for line in outcome.trace if "a3-rollback" in line][-3:]


def test_a_start_claimed_during_a_rollbacks_checks_fences_the_rollback() -> None:
    """Found by a review (helper-60, 2026-11-30; directory sink): the rollback of a
    superseded generation took its fence (the newest claim) after its checks of the newer
    lineages. a1 (empty state) dies after its origin; a3's rollback of generation 1 reads
    the newest generation (2); a2 claims generation 3, a restore by path of the first
    lineage's checkpoint of batch 1, and writes its origin after a3's checks read the
    origins; a3's fence was generation 3 itself, so its aborts of batches 0 and 1, which
    a2's start point confirms, passed every check: "the sink holds batches [2, 3, 4];
    expected [0, 1, 2, 3, 4] (missing [0, 1])". Fixed: the rollback acts as the
    generation it read first, so a claim during its checks fences it."""
    schedule = Schedule("directory", 5, (
        _driver(budget=2, num_retained=6, commit_mode="external"),
        _driver(restore="none", budget=1, num_retained=6),
        _driver(restore="path", budget=2, num_retained=6, commit_mode="external"),
        ActorSpec("rollback"),
        ActorSpec("commit"),
    ))
    pauses = [
        Pause("a1", ("pause recovery",), crash=True),
        # a2 claims only after the rollback read the newest generation (2)
        Pause("a2", ("put_if_absent sim/generations/",), "a3", ("stat sim/generations/",)),
        # a2 writes its origin only after the rollback read the generations again
        Pause("a2", ("put_if_absent sim/lineage/",), "a3", ("stat sim/generations/",)),
        # the rollback decides its aborts only after a2's recovery kept the first lineage's records pending
        Pause("a3", ("_sparkpoint/decisions/",), "a2", ("sink.cleanup_orphans",)),
        # a2 checkpoints, and the commit step runs, after the rollback ended
        Pause("a2", ("put_if_absent sim/chk-",), "a3"),
        Pause("a4", ("sim/generations/",), "a2"),
    ]
    run_schedule(schedule, ScriptedChooser(pauses, options=[1, 0]))  # chk-2 (batch 1); generation 1
