"""Schedules to explore: drawn by Hypothesis (the CI test, shrinking) or by a seeded
`random.Random` (the long exploration). One description of the space for both."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from tests.simulation.actors import CutoverSpec, DriverSpec
from tests.simulation.model import DELTA_KINDS
from tests.simulation.simulate import ActorSpec, Schedule

RESTORES = ("latest", "latest", "path", "path", "none")
SINK_AHEAD = ("fail", "rewind")
COMMIT_MODES = ("checkpoint", "external")
KINDS = ("driver", "driver", "driver", "commit", "savepoint", "stop", "retention", "rollback", "cutover")
#: the share of schedules on the Delta sink (slower: delta-rs commits and reads), and of
#: those, on a merge table (a rewind or recovery that identifies a merge's commit by its
#: commit info, not by its files): drawn from the same number, so a seed's other draws and
#: the pinned replays keep their schedules
DELTA_SHARE = 0.25
MERGE_SHARE = 0.10
#: the share of schedules with a cutover that also have a call-off beside it (drawn from a
#: side generator seeded by the schedule's own state, so that a seed's other draws, its
#: chooser and the pinned replays without a cutover keep what they drew)
CALL_OFF_SHARE = 0.5
#: the share of restores by path that restore a savepoint moved outside the job's root
#: (on its service: `actors._moved_savepoint`), drawn from a side generator of its own
#: (a seed's other draws keep what they drew; only those restores differ)
MOVED_SHARE = 0.3


def _driver(pick: Any) -> DriverSpec:
    return DriverSpec(
        restore=pick(RESTORES), sink_ahead=pick(SINK_AHEAD), commit_mode=pick(COMMIT_MODES),
        version=pick((1, 2, 3)), budget=pick((1, 2, 3, 4, 5, 6)), num_retained=pick((1, 2, 3, 6)),
        interval_s=pick((0.0, 0.0, 5.0)), timeout_s=pick((600.0, 30.0)),
    )


def _actor(pick: Any) -> ActorSpec:
    kind = pick(KINDS)
    if kind == "driver":
        return ActorSpec("driver", _driver(pick))
    if kind == "retention":
        return ActorSpec("retention", keep=pick((1, 2)))
    if kind == "cutover":
        return ActorSpec("cutover", cutover=CutoverSpec(margin=pick((-1, 0, 1, 1, 2)), version=pick((2, 3)),
                                                        budget=pick((1, 2, 3))))
    return ActorSpec(kind)


def random_schedule(rng: random.Random) -> Schedule:
    def pick(options: Any) -> Any:
        return options[rng.randrange(len(options))]

    first = ActorSpec("driver", _driver(pick))  # something to restore, roll back, commit
    count = rng.randrange(1, 6)
    draw = rng.random()
    sink = "delta-merge" if draw < MERGE_SHARE else "delta" if draw < DELTA_SHARE else "directory"
    actors = (first, *(_actor(pick) for _ in range(count)))
    side = random.Random(repr(rng.getstate()[1][:8]))  # consumes nothing of `rng`
    if any(a.kind == "cutover" for a in actors) and side.random() < CALL_OFF_SHARE:
        actors = (*actors, ActorSpec("calloff"))
    moved = random.Random("moved" + repr(rng.getstate()[1][:8]))
    actors = tuple(replace(a, driver=replace(a.driver, restore="moved"))
                   if a.driver is not None and a.driver.restore == "path" and moved.random() < MOVED_SHARE
                   else a
                   for a in actors)
    return Schedule(sink, rng.randrange(3, 9), actors)


def retention_beside_cutover(rng: random.Random) -> Schedule:
    """A running blue, a zero-downtime cutover, a savepoint and savepoint history
    retention, and one more actor or none (another pass, a rollback, the commit step, a
    retry, a stop): where retention judges blue's final savepoint S (before the agreement,
    before green's claim, after green's first commit, after a rollback of green). The
    random exploration's share of them: `explore.random_run`."""
    def pick(options: Any) -> Any:
        return options[rng.randrange(len(options))]

    blue = DriverSpec(budget=pick((4, 5, 6)), num_retained=pick((1, 2, 3)), interval_s=pick((0.0, 0.0, 5.0)))
    cutover = CutoverSpec(margin=pick((-1, 0, 1, 1, 2)), version=pick((2, 3)), budget=pick((1, 2, 3)),
                          num_retained=pick((1, 6)))
    beside = [ActorSpec("savepoint"), ActorSpec("retention", keep=pick((1, 2)))]  # a newer savepoint first
    extra = pick(("", "retention", "rollback", "commit", "driver", "stop"))
    if extra:
        spec = (ActorSpec("retention", keep=1) if extra == "retention"
                else ActorSpec("driver", DriverSpec(restore="latest", budget=pick((1, 2, 3))))
                if extra == "driver" else ActorSpec(extra))
        beside.insert(rng.randrange(3), spec)
    draw = rng.random()
    sink = "delta-merge" if draw < MERGE_SHARE else "delta" if draw < DELTA_SHARE else "directory"
    return Schedule(sink, rng.randrange(5, 9),
                    (ActorSpec("driver", blue), ActorSpec("cutover", cutover=cutover),
                     *beside),
                    races=("generations", "lineage", "txn", "control", "cutover", "sink", "checkpoints"),
                    directed=(0, 1, 2, 3))


def rollback_beside_lineages(rng: random.Random) -> Schedule:
    """A first run whose retention may delete the checkpoint a savepoint was copied from,
    a savepoint, a start from a snapshot by path (or a moved copy) that may die or hold
    before its first checkpoint, a rollback of a generation claimed by then, the commit
    step, and maybe a retry: the rollback refuses while a newer lineage continues the
    generation, and no lineage checkpoints past a batch aborted under it. Found by a
    review (two windows the generic space did not reach in 617,000 schedules); the random
    exploration's share of them: `explore.random_run`."""
    def pick(options: Any) -> Any:
        return options[rng.randrange(len(options))]

    first = DriverSpec(budget=pick((2, 3, 4, 5)), num_retained=pick((1, 1, 2)),
                       commit_mode=pick(COMMIT_MODES))
    start = DriverSpec(restore=pick(("path", "path", "moved")), sink_ahead=pick(SINK_AHEAD),
                       commit_mode=pick(COMMIT_MODES), budget=pick((1, 2, 3)), num_retained=pick((1, 2)))
    actors = [ActorSpec("driver", first), ActorSpec("savepoint"), ActorSpec("driver", start),
              ActorSpec("rollback"), ActorSpec("commit")]
    if rng.random() < 0.5:
        actors.append(ActorSpec("driver", DriverSpec(restore="latest", commit_mode=pick(COMMIT_MODES),
                                                     budget=pick((1, 2)))))
    draw = rng.random()
    sink = "delta-merge" if draw < MERGE_SHARE else "delta" if draw < DELTA_SHARE else "directory"
    return Schedule(sink, rng.randrange(4, 8), tuple(actors),
                    races=("generations", "lineage", "txn", "checkpoints", "sink", "savepoints", "pins"),
                    directed=(0, 1, 2, 3, 4))


def schedules(cutover: bool = False) -> Any:
    """The Hypothesis strategy of schedules (shrinks towards fewer, simpler actors); with
    `cutover`, a zero-downtime cutover is one of the actors too (the family
    ``generic_cutover``: kept apart so that the CI seeds of ``generic`` draw what they drew)."""
    from hypothesis import strategies as st

    drivers = st.builds(
        DriverSpec,
        restore=st.sampled_from(("latest", "path", "none")),
        sink_ahead=st.sampled_from(SINK_AHEAD),
        commit_mode=st.sampled_from(COMMIT_MODES),
        version=st.integers(1, 3),
        budget=st.integers(1, 6),
        num_retained=st.sampled_from((1, 2, 3, 6)),
        interval_s=st.sampled_from((0.0, 5.0)),
        timeout_s=st.sampled_from((600.0, 30.0)),
    )
    actor = st.one_of(
        drivers.map(lambda d: ActorSpec("driver", d)),
        st.sampled_from(("commit", "savepoint", "stop", "rollback")).map(ActorSpec),
        st.integers(1, 2).map(lambda keep: ActorSpec("retention", keep=keep)),
        *((_cutover_spec().map(lambda c: ActorSpec("cutover", cutover=c)),) if cutover else ()),
    )
    return st.builds(
        lambda sink, inputs, first, rest: Schedule(sink, inputs, (ActorSpec("driver", first), *rest)),
        st.sampled_from(("directory", "directory", "directory", "delta")),
        st.integers(3, 8),
        drivers,
        st.lists(actor, min_size=1, max_size=5),
    )


# ---------------------------------------------------------------------------- families
# Shapes of schedule around one part of the protocol: the generic space reaches them
# too, but rarely; each family spends its schedules where its windows are.


def _family(first: Any, rest: Any, sinks: Any = None) -> Any:
    from hypothesis import strategies as st

    return st.builds(
        lambda sink, inputs, head, tail: Schedule(sink, inputs, (ActorSpec("driver", head), *tail)),
        sinks if sinks is not None else st.sampled_from(("directory", *DELTA_KINDS)),
        st.integers(4, 7),
        first,
        rest,
    )


def _drain(**fixed: Any) -> Any:
    """The first run: drains most of the input and keeps every checkpoint."""
    from hypothesis import strategies as st

    settings: dict[str, Any] = {"budget": st.integers(3, 6), "num_retained": st.just(6),
                                "commit_mode": st.sampled_from(COMMIT_MODES)}
    settings.update({k: v if isinstance(v, st.SearchStrategy) else st.just(v) for k, v in fixed.items()})
    return st.builds(DriverSpec, **settings)


def _start(**fixed: Any) -> Any:
    """A later start (a retry, a deploy, a restore by hand)."""
    from hypothesis import strategies as st

    settings: dict[str, Any] = {
        "restore": st.sampled_from(("path", "latest")), "sink_ahead": st.sampled_from(SINK_AHEAD),
        "commit_mode": st.sampled_from(COMMIT_MODES), "version": st.integers(1, 3),
        "budget": st.integers(1, 3), "num_retained": st.just(6)}
    settings.update({k: v if isinstance(v, st.SearchStrategy) else st.just(v) for k, v in fixed.items()})
    return st.builds(DriverSpec, **settings).map(lambda d: ActorSpec("driver", d))


def _shape(sinks: Any, first: Any, *rest: Any, races: tuple[str, ...] = (),
           directed: tuple[int, ...] | None = None) -> Any:
    from hypothesis import strategies as st

    return st.builds(lambda sink, inputs, head, *tail: Schedule(sink, inputs,
                                                                (ActorSpec("driver", head), *tail),
                                                                races, directed),
                     sinks, st.integers(5, 7), first, *rest)


def across_lineages() -> Any:
    """A run drains and keeps its checkpoints, a savepoint is taken, then two restores
    by path of snapshots of any lineage, with each policy (invariants 4, 9, 12)."""
    from hypothesis import strategies as st

    return _shape(st.sampled_from(("directory", *DELTA_KINDS)), _drain(), st.just(ActorSpec("savepoint")),
                  _start(restore="path"), _start(restore="path"))


def rewinds() -> Any:
    """`across_lineages` on a Delta table with rewinding restores: a rewind must land on
    the restored lineage's own commit (invariant 12)."""
    from hypothesis import strategies as st

    return _shape(st.sampled_from(DELTA_KINDS), _drain(commit_mode="checkpoint"),
                  st.just(ActorSpec("savepoint")),
                  _start(restore="path", sink_ahead="rewind", budget=st.integers(1, 4)),
                  _start(restore="path", sink_ahead="rewind"))


def commit_step_races() -> Any:
    """The external commit step beside the start of a new lineage (a restore by path)."""
    from hypothesis import strategies as st

    return _shape(st.sampled_from(("directory", *DELTA_KINDS)), _drain(commit_mode="external"),
                  _start(restore="path", commit_mode="external"), st.just(ActorSpec("commit")),
                  races=("generations", "lineage", "txn", "checkpoints", "sink"), directed=(1, 2))


def moved_savepoint_starts() -> Any:
    """A start from a savepoint moved outside the job's root (restored by path, no pin),
    in external commit mode, that may die before its first checkpoint, beside the commit
    step, savepoint history retention and a retry: the step settles what the moved
    savepoint confirms, never aborts it, never confirms what it does not."""
    from hypothesis import strategies as st

    return _shape(st.sampled_from(("directory", *DELTA_KINDS)), _drain(commit_mode="external"),
                  st.just(ActorSpec("savepoint")),
                  _start(restore="moved", commit_mode="external", budget=st.integers(1, 2),
                         interval_s=st.sampled_from((0.0, 5.0))),
                  st.just(ActorSpec("commit")),
                  st.sampled_from((ActorSpec("retention", keep=1), ActorSpec("commit"))),
                  _start(restore="latest", commit_mode=st.sampled_from(COMMIT_MODES),
                         budget=st.integers(1, 2)),
                  races=("generations", "lineage", "txn", "checkpoints", "sink", "savepoints"),
                  directed=(2, 3))


def savepoint_retention_races() -> Any:
    """Savepoint history retention beside a restore by path of a savepoint."""
    from hypothesis import strategies as st

    return _shape(st.just("directory"), _drain(commit_mode="checkpoint"), st.just(ActorSpec("savepoint")),
                  st.just(ActorSpec("savepoint")), _start(restore="path"),
                  st.integers(1, 2).map(lambda keep: ActorSpec("retention", keep=keep)),
                  races=("lineage", "savepoints", "pins", "checkpoints"), directed=(3, 4))


def lineage_starts() -> Any:
    """A restore by path of one of two savepoints of a drained job (its lineage has no
    checkpoint of its own: nothing is left to read) beside savepoint history retention:
    the lineage's starting point must outlive the retention (item 6)."""
    from hypothesis import strategies as st

    def shape(inputs: int, first: DriverSpec, start: ActorSpec, keep: int) -> Schedule:
        return Schedule("directory", inputs, (ActorSpec("driver", first), ActorSpec("savepoint"),
                                              ActorSpec("savepoint"), start,
                                              ActorSpec("retention", keep=keep)),
                        ("lineage",), (3, 4))

    return st.builds(shape, st.integers(2, 4).flatmap(lambda n: st.just(n)),
                     st.builds(DriverSpec, budget=st.just(8), num_retained=st.just(6)),
                     _start(restore="path", budget=st.integers(1, 2)), st.just(1))


def checkpoint_retention_races() -> Any:
    """Checkpoint retention of runs that stall (a short checkpoint timeout, so orphaned
    shared files go within a stall) beside restores and retries; pins of restores by path."""
    from hypothesis import strategies as st

    retry = st.builds(DriverSpec, restore=st.sampled_from(("path", "latest", "latest")),
                      budget=st.integers(1, 3),
                      num_retained=st.integers(1, 2),
                      timeout_s=st.just(30.0)).map(lambda d: ActorSpec("driver", d))
    first = st.builds(DriverSpec, budget=st.integers(2, 5), num_retained=st.integers(1, 2),
                      timeout_s=st.just(30.0))
    return _shape(st.just("directory"), first, retry, retry, retry,
                  races=("shared", "journal", "checkpoints", "lineage", "pins"))


def _cutover_spec() -> Any:
    from hypothesis import strategies as st

    return st.builds(CutoverSpec, margin=st.integers(-1, 2), version=st.integers(2, 3),
                     budget=st.integers(1, 3))


def cutovers() -> Any:
    """A zero-downtime cutover (issue 49) of a running blue: blue serves ``stop_after``
    beside the commit step, savepoint retention, a stop, and a retry of blue's task;
    green claims and continues with other code."""
    from hypothesis import strategies as st

    blue = st.builds(DriverSpec, budget=st.integers(3, 6), num_retained=st.integers(1, 3),
                     commit_mode=st.sampled_from(("checkpoint", "checkpoint", "external")),
                     interval_s=st.sampled_from((0.0, 0.0, 5.0)))
    retry = st.builds(DriverSpec, restore=st.just("latest"), budget=st.integers(1, 3)).map(
        lambda d: ActorSpec("driver", d))
    beside = st.one_of(retry, st.sampled_from(("commit", "stop", "savepoint")).map(ActorSpec),
                       st.integers(1, 2).map(lambda keep: ActorSpec("retention", keep=keep)))
    return _shape(st.sampled_from(("directory", "directory", *DELTA_KINDS)), blue,
                  _cutover_spec().map(lambda c: ActorSpec("cutover", cutover=c)),
                  st.lists(beside, max_size=2),
                  races=("generations", "lineage", "txn", "control", "cutover", "sink", "checkpoints"),
                  directed=(0, 1)).map(_flatten)


def _flatten(schedule: Schedule) -> Schedule:
    """`_shape` with a list among its actors: spread it."""
    actors: list[ActorSpec] = []
    for actor in schedule.actors:
        actors.extend(actor if isinstance(actor, list) else [actor])
    return Schedule(schedule.sink, schedule.inputs, tuple(actors), schedule.races, schedule.directed)


def call_off_races() -> Any:
    """A cutover and its call-off (a bound, a killed task) beside it: the call-off
    races the agreement, blue's stop and green's claim; one decision stands."""
    from hypothesis import strategies as st

    blue = st.builds(DriverSpec, budget=st.integers(3, 6), num_retained=st.integers(1, 3))
    return _shape(st.sampled_from(("directory", "directory", *DELTA_KINDS)), blue,
                  _cutover_spec().map(lambda c: ActorSpec("cutover", cutover=c)),
                  st.just(ActorSpec("calloff")),
                  races=("cutover", "lineage", "generations", "control"), directed=(1, 2))


FAMILIES = {"generic": schedules, "generic_cutover": lambda: schedules(cutover=True),
            "across_lineages": across_lineages, "rewinds": rewinds, "commit_step_races": commit_step_races,
            "savepoint_retention_races": savepoint_retention_races, "lineage_starts": lineage_starts,
            "checkpoint_retention_races": checkpoint_retention_races, "cutovers": cutovers,
            "call_off_races": call_off_races, "moved_savepoint_starts": moved_savepoint_starts}
