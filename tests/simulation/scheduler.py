"""The deterministic scheduler of the protocol simulation.

Every actor (a driver, the commit step, a savepoint request, a retention pass...) runs the
real code in a greenlet of its own (all in one OS thread: a switch costs neither a system
call nor a wait for a core), so only one runs at a time: an actor runs until it reaches a
*point* (every storage and sink call, every fault and pause point of the product), where
it hands the baton back. The scheduler then asks its `Chooser`
which actor goes next, whether the one it resumes dies there (`Crash`, a SIGKILL: the
actor's greenlet unwinds and every later point of it raises again, so no ``finally`` block
of the product acts after death), and how far the virtual clock moves (a stall). The
choices are Hypothesis draws in the CI test (so a failure shrinks to a short schedule)
and a seeded `random.Random` in the long exploration; either way the same choices give
the same run, step for step.

Time is virtual (`SimClock`): the product's ``time`` module is replaced in every module
of the package by a clock that only the scheduler moves, and ``time.sleep`` is a point.
"""

from __future__ import annotations

import faulthandler
import os
import random
import sys
import threading
import time as real_time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from greenlet import getcurrent, greenlet

#: how long (real seconds) a `Scheduler.run` may go without a step: an actor blocked
#: elsewhere (a lock, a hang) blocks the only thread, so the process then exits with every
#: stack printed (`_Watchdog`)
RUN_TIMEOUT_S = 60.0


class Crash(BaseException):
    """The actor's process died at this point (SIGKILL). A BaseException, so that the
    product's ``except Exception`` never swallows it."""


# ---------------------------------------------------------------------------- choices


class Event:
    """What may happen at a step besides the resumed actor going on (`Chooser.event`)."""

    NOTHING, CRASH, STALL, LONG_STALL, STALL_CRASH = 0, 1, 2, 3, 4


class Chooser:
    """What the scheduler asks at each step (see the module docstring)."""

    def pick(self, ready: list[Actor]) -> int:
        """Which of the `ready` actors goes on (index; the one that ran last comes first)."""
        raise NotImplementedError

    def event(self, actor: Actor) -> int:
        """An `Event` value for `actor`'s resumption: nothing, it crashes there, or a stall."""
        raise NotImplementedError

    def option(self, count: int) -> int:
        """An actor's own choice among `count` options (which snapshot to restore)."""
        raise NotImplementedError


class StepChooser(Chooser):
    """A choice at every step: mostly the actor that ran last goes on, now and then
    another; crashes and stalls are rare. `draw(n)` returns 0..n-1 (a seeded random
    number, or a Hypothesis draw: every choice then shrinks towards 0, a sequential
    history without crashes)."""

    def __init__(self, draw: Callable[[int], int]) -> None:
        self.draw = draw
        self._stay: int | None = None  # of 64 picks, how many stay (drawn once per schedule)

    def pick(self, ready: list[Actor]) -> int:
        if len(ready) == 1:
            return 0
        if self._stay is None:  # how often this schedule switches: rarely (long runs) .. often
            self._stay = (63, 60, 48)[self.draw(3)]
        value = self.draw(64)
        return 0 if value < self._stay else 1 + (value - self._stay) % (len(ready) - 1)

    def event(self, actor: Actor) -> int:
        return {508: Event.CRASH, 509: Event.CRASH, 510: Event.STALL, 511: Event.LONG_STALL}.get(
            self.draw(512), Event.NOTHING)

    def option(self, count: int) -> int:
        return 0 if count <= 1 else self.draw(count)


#: the records and the calls that read, write or delete them (substrings of point labels):
#: a race is two actors' accesses to one kind of record, at least one of them a change
ACCESSES: dict[str, dict[str, tuple[str, ...]]] = {
    "generations": {"write": ("put_if_absent sim/generations/",),
                    "read": ("list sim/generations/", "stat sim/generations/")},
    "lineage": {"write": ("put_if_absent sim/lineage/",), "read": ("list sim/lineage/",),
                "delete": ("delete sim/lineage/",)},
    "txn": {"write": ("put sim/txn/",), "read": ("list sim/txn/",), "delete": ("delete sim/txn/",)},
    "checkpoints": {"write": ("put_if_absent sim/chk-",), "read": ("list_dirs sim/",),
                    "delete": ("delete sim/chk-",)},
    "shared": {"write": ("upload sim/shared/",), "read": ("list sim/shared/",),
               "delete": ("delete sim/shared/",)},
    "journal": {"write": ("put sim/gc/",), "read": ("list sim/gc/",)},
    "savepoints": {"write": ("put_if_absent sim/savepoints/",), "read": ("list_dirs sim/savepoints/",),
                   "delete": ("delete sim/savepoints/",)},
    "pins": {"write": ("put_if_absent sim/pins/",), "delete": ("delete sim/pins/",)},
    "control": {"write": ("put_if_absent sim/control/",), "read": ("list sim/control/",
                                                                  "get sim/control/")},
    "status": {"write": ("put sim/status",), "read": ("get sim/status",)},
    "cutover": {"write": ("put_if_absent sim/cutover/",), "read": ("list sim/cutover/", "get sim/cutover/")},
    "sink": {"write": ("sink.commit", "sink.rewind", "_sparkpoint/decisions/"),
             "delete": ("sink.abort",),
             "read": ("sink.committed_position", "sink.is_committed", "sink.committed_txn")},
}
RACES = tuple(ACCESSES)


def _matches(label: str, patterns: tuple[str, ...]) -> bool:
    return any(p in label for p in patterns)


@dataclass
class Directive:
    """Pause `actor` when it is about to pass `milestone` for the `occurrence`-th time,
    until `until` has passed `release` (or ended, when `release` is ""); `ending` may
    crash it there or stall it instead."""

    actor: Actor
    milestone: tuple[str, ...]
    occurrence: int
    until: Actor
    release: tuple[str, ...]  # () : until `until` ended
    ending: int
    seen: int = 0
    state: str = "waiting"  # waiting | active | done
    release_seen: bool = False


class DirectedChooser(Chooser):
    """Sequential histories with a few directed races: by default the actors run one
    after another in the order they were spawned (the lowest that can run goes on); up
    to three *directives* each reorder two actors' accesses to one kind of record
    (`ACCESSES`, at least one of them a change): actor X is paused just before its k-th
    access of one class (read, write, delete) until actor Y passed an access of another
    class to the same records (or ended), and may crash or stall there instead. A race
    between two actors is one directive (say, the commit step paused between its read of
    the origins and its read of the records while a new generation writes its origin and
    records a batch), found in a few hundred schedules; a failure shrinks to the
    directives that matter. `hints` (a schedule's) narrow the races and the actors.
    `draw(n)` as for `StepChooser` (no directive: the sequential history)."""

    def __init__(self, draw: Callable[[int], int], *, races: tuple[str, ...] = RACES,
                 actors: tuple[int, ...] | None = None) -> None:
        self.draw = draw
        self.races = races
        self.focus = actors
        self.directives: list[Directive] | None = None
        self.actors: list[Actor] = []
        self._crash: Actor | None = None
        self._stall: tuple[Actor, int] | None = None

    def _draw_directives(self) -> list[Directive]:
        actors = self.actors
        chosen = [actors[i] for i in self.focus if i < len(actors)] if self.focus is not None else actors
        directives = []
        for _ in range(self.draw(4) if len(chosen) > 1 else 0):
            actor = chosen[self.draw(len(chosen))]
            others = [a for a in chosen if a is not actor]
            until = others[self.draw(len(others))]
            accesses = ACCESSES[self.races[self.draw(len(self.races))]]
            classes = sorted(accesses)
            mine = classes[self.draw(len(classes))]
            theirs = [c for c in classes if mine != "read" or c != "read"]
            release_class = ([""] + theirs)[self.draw(len(theirs) + 1)]
            ending = (Event.NOTHING,) * 5 + (Event.CRASH, Event.STALL, Event.LONG_STALL)
            directives.append(Directive(actor, accesses[mine], 1 + self.draw(2), until,
                                        accesses[release_class] if release_class else (),
                                        ending[self.draw(len(ending))]))
        return directives

    def describe(self) -> list[str]:
        """The directives, readable (for the trace)."""
        return [f"directive: {d.actor.name} waits before its access #{d.occurrence} matching {d.milestone} "
                f"until {d.until.name} " + (f"passed {d.release}" if d.release else "ended")
                + {Event.CRASH: ", and dies there", Event.STALL: ", stalling",
                   Event.LONG_STALL: ", stalling long"}
                .get(d.ending, "") for d in self.directives or ()]

    def pick(self, ready: list[Actor]) -> int:
        for actor in ready:
            if actor not in self.actors:
                self.actors.append(actor)
        if self.directives is None:
            self.directives = self._draw_directives()
        for directive in self.directives:  # releases: the actor it waits for passed its point, or ended
            if directive.state != "active":
                continue
            until = directive.until
            if until.state == "done" or (directive.release and directive.release_seen
                                          and not _matches(until.label, directive.release)):
                directive.state = "done"
            elif directive.release and _matches(until.label, directive.release):
                directive.release_seen = True
        while True:
            paused = {d.actor for d in self.directives if d.state == "active"}
            runnable = [a for a in sorted(ready, key=self.actors.index) if a not in paused]
            if not runnable:  # everything waits: the oldest pause gives way
                next(d for d in self.directives if d.state == "active").state = "done"
                continue
            actor = runnable[0]
            hit = next((d for d in self.directives if d.state == "waiting" and d.actor is actor
                        and _matches(actor.label, d.milestone)), None)
            if hit is None:
                return ready.index(actor)
            hit.seen += 1
            if hit.seen < hit.occurrence:
                hit.state = "passed"  # this access goes through; the next one is the directive's
                return ready.index(actor)
            if hit.ending == Event.CRASH:
                hit.state, self._crash = "done", actor
                return ready.index(actor)
            if hit.until is actor:  # no wait: only what happens there (a stall)
                hit.state = "done"
                if hit.ending in (Event.STALL, Event.LONG_STALL):
                    self._stall = (actor, hit.ending)
                return ready.index(actor)
            hit.state = "active"
            if hit.ending in (Event.STALL, Event.LONG_STALL):  # it stalls while paused: time passes
                self._stall = (actor, hit.ending)

    def event(self, actor: Actor) -> int:
        for directive in self.directives or ():
            if directive.state == "passed" and directive.actor is actor:
                directive.state = "waiting"  # it passed the earlier access: wait for the next
        if actor is self._crash:
            self._crash = None
            return Event.CRASH
        if self._stall is not None and actor is self._stall[0]:
            stall, self._stall = self._stall[1], None
            return stall
        return Event.NOTHING

    def option(self, count: int) -> int:
        return 0 if count <= 1 else self.draw(count)


@dataclass(frozen=True)
class Pause:
    """A directive of a `ScriptedChooser`, by actor names (see `Directive`): `release`
    empty waits for `until`'s end, no `until` waits for nobody; `crash` makes `actor` die
    there instead, `stall` makes time jump there by `STALL_S`."""

    actor: str
    before: tuple[str, ...]
    until: str = ""
    release: tuple[str, ...] = ()
    occurrence: int = 1
    crash: bool = False
    stall: bool = False


class HeldChooser(DirectedChooser):
    """A `DirectedChooser` whose first directives are given (`pauses`: the shape of a
    race the exploration searches around, or all of a pinned one), then races as drawn."""

    def __init__(self, draw: Callable[[int], int], pauses: Sequence[Pause], **kwargs: Any) -> None:
        super().__init__(draw, **kwargs)
        self.pauses = list(pauses)

    def _draw_directives(self) -> list[Directive]:
        drawn = super()._draw_directives()
        by_name = {a.name.split("-", 1)[0]: a for a in self.actors}
        held = [Directive(by_name[p.actor], p.before, p.occurrence, by_name[p.until or p.actor], p.release,
                          Event.CRASH if p.crash else Event.STALL if p.stall else Event.NOTHING)
                for p in self.pauses]
        return [*held, *drawn]


class ScriptedChooser(HeldChooser):
    """A `HeldChooser` with nothing drawn: its directives and options are given (a
    schedule the exploration found, pinned as an example test)."""

    def __init__(self, pauses: Sequence[Pause], options: Sequence[int] = ()) -> None:
        super().__init__(lambda count: 0, pauses)
        self.options = list(options)

    def option(self, count: int) -> int:
        return (self.options.pop(0) if self.options else 0) % max(1, count)


def random_draw(seed: int) -> Callable[[int], int]:
    """`draw` for the long exploration: seeded, uniform."""
    rng = random.Random(seed)
    return rng.randrange


def hypothesis_draw(data: Any) -> Callable[[int], int]:
    """`draw` for the CI test: a Hypothesis draw (shrinks towards 0)."""
    from hypothesis import strategies as st

    def draw(count: int) -> int:
        return 0 if count <= 1 else int(data.draw(st.integers(0, count - 1)))

    return draw


#: a step's virtual duration, and the stalls a chooser may ask for (seconds)
STEP_S = 0.05
STALL_S = 90.0
LONG_STALL_S = 3700.0


# ---------------------------------------------------------------------------- the clock


class SimClock:
    """Virtual wall and monotonic time; `sleep` is a scheduling point."""

    def __init__(self, scheduler: Scheduler | None = None, start: float = 1_800_000_000.0) -> None:
        self.now = start
        self.scheduler = scheduler

    def advance(self, seconds: float) -> None:
        self.now += seconds

    # the `time` module's functions the package uses
    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now - 1_700_000_000.0

    def perf_counter(self) -> float:
        return self.monotonic()

    def sleep(self, seconds: float) -> None:
        if self.scheduler is not None and self.scheduler.in_actor():
            self.scheduler.point(f"sleep {seconds:g}s", sleep=max(0.0, float(seconds)))
        else:
            self.now += max(0.0, float(seconds))

    def gmtime(self, seconds: float | None = None) -> Any:
        return real_time.gmtime(self.now if seconds is None else seconds)

    def strftime(self, fmt: str, t: Any = None) -> str:
        return real_time.strftime(fmt, self.gmtime() if t is None else t)

    def localtime(self, seconds: float | None = None) -> Any:
        return real_time.localtime(self.now if seconds is None else seconds)


@contextmanager
def virtual_time(clock: SimClock, package: str = "airflow_sparkpoint") -> Iterator[None]:
    """Replace ``time`` in every imported module of `package` that imported the module
    (``import time``) by `clock`, for the duration of the block."""
    patched = []
    for name, module in list(sys.modules.items()):
        if module is None or not (name == package or name.startswith(package + ".")):
            continue
        if getattr(module, "time", None) is real_time:
            patched.append(module)
            module.time = clock  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for module in patched:
            module.time = real_time  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- the scheduler


class _Watchdog:
    """A daemon thread (one per process) that ends the process, printing every stack,
    when a `Scheduler.run` made no step for `RUN_TIMEOUT_S`: an actor blocked outside the
    scheduler (a lock, a hang) blocks the only thread the actors run in."""

    def __init__(self) -> None:
        self.steps = 0  # every scheduler's steps so far
        self.running = 0  # `Scheduler.run` calls in progress
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="sim-watchdog", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        seen = -1
        while True:
            real_time.sleep(RUN_TIMEOUT_S)
            if self.running and self.steps == seen:
                print(f"simulation: no step for {RUN_TIMEOUT_S:g} s (an actor blocked outside the scheduler)",
                      file=sys.stderr, flush=True)
                faulthandler.dump_traceback(all_threads=True)
                os._exit(70)
            seen = self.steps


_WATCHDOG = _Watchdog()


@dataclass(eq=False)
class Actor:
    name: str
    fn: Callable[[], Any]
    state: str = "ready"  # ready | running | done
    label: str = "start"
    crashed: bool = False
    crash_next: bool = False
    sleep: float = 0.0  # virtual seconds it asked to sleep at its current point
    options: int = 0  # a choice it waits for (`Scheduler.choose`), among this many
    answer: int = 0
    result: Any = None
    error: BaseException | None = None
    glet: greenlet | None = None  # its line of execution (started at its first step)
    #: called (in the scheduler's greenlet) when the actor crashed: what the OS does at a
    #: process's death (its locks released)
    on_crash: list[Callable[[], None]] = field(default_factory=list)

    @property
    def finished_ok(self) -> bool:
        return self.state == "done" and not self.crashed and self.error is None


class Scheduler:
    """Runs actors one at a time (see the module docstring)."""

    def __init__(self, chooser: Chooser, *, max_steps: int = 1500,
                 check: Callable[[], None] | None = None) -> None:
        self.chooser = chooser
        self.clock = SimClock(self)
        self.max_steps = max_steps
        self.check = check
        self.actors: list[Actor] = []
        self.trace: list[str] = []
        self.steps = 0
        self._running: Actor | None = None  # the actor whose greenlet runs now
        self._hub: greenlet | None = None  # the scheduler's own greenlet (the caller of `run`)
        self._last: Actor | None = None

    # -- used by the actors ------------------------------------------------------------

    def in_actor(self) -> bool:
        return self.current() is not None

    def current(self) -> Actor | None:
        """The actor running now, or None in the harness (and in any other thread)."""
        actor = self._running
        return actor if actor is not None and actor.glet is getcurrent() else None

    def point(self, label: str, *, sleep: float = 0.0) -> None:
        """Hand the baton back at `label`; returns when the scheduler resumes this actor.

        :raises Crash: the actor dies here (or died before).
        """
        actor = self.current()
        if actor is None:
            return  # the harness's own reads and the final checks run unscheduled
        if actor.crashed:
            raise Crash(actor.name)
        actor.label, actor.sleep, actor.state = label, sleep, "ready"
        assert self._hub is not None
        self._hub.switch()
        if actor.crash_next:
            actor.crashed = True
            raise Crash(actor.name)

    def choose(self, label: str, options: list[Any]) -> Any:
        """An actor's own choice among `options` (drawn by the chooser), made at a point."""
        if not options:
            raise ValueError(f"{label}: nothing to choose from")
        actor = self.current()
        if actor is None:
            return options[0]
        actor.options = len(options)  # drawn in the scheduler's greenlet (Hypothesis draws there only)
        self.point(f"choose {label}")
        index, actor.options = actor.answer, 0
        self.trace.append(f"      {actor.name} chose {label}: {options[index]}")
        return options[index]

    # -- used by the harness ---------------------------------------------------------

    def spawn(self, name: str, fn: Callable[[], Any]) -> Actor:
        actor = Actor(name, fn)

        def body() -> None:
            try:
                if actor.crash_next:
                    actor.crashed = True
                    raise Crash(actor.name)
                actor.result = actor.fn()
            except Crash:
                actor.crashed = True
            except BaseException as exc:  # noqa: BLE001 - the harness judges it
                actor.error = exc
            finally:
                actor.state = "done"

        actor.glet = greenlet(body)
        self.actors.append(actor)
        return actor

    def run(self) -> None:
        """Run until every actor is done; past `max_steps` every actor left is crashed
        (everything killed at once, as a lost machine would). An actor blocked outside
        the scheduler for `RUN_TIMEOUT_S` ends the process (`_Watchdog`)."""
        self._hub = getcurrent()
        _WATCHDOG.start()
        _WATCHDOG.running += 1
        try:
            self._run()
        finally:
            _WATCHDOG.running -= 1

    def _run(self) -> None:
        while True:
            ready = [a for a in self.actors if a.state == "ready"]
            if not ready:
                return
            if self._last in ready:  # the one that ran last first: choice 0 goes on with it
                ready.remove(self._last)
                ready.insert(0, self._last)
            self.steps += 1
            _WATCHDOG.steps += 1
            if self.steps > self.max_steps:
                actor, event = ready[0], Event.CRASH
            else:
                actor = ready[self.chooser.pick(ready)]
                event = self.chooser.event(actor)
            crash = event in (Event.CRASH, Event.STALL_CRASH)
            stall = {Event.STALL: STALL_S, Event.STALL_CRASH: STALL_S,
                     Event.LONG_STALL: LONG_STALL_S}.get(event, 0.0)
            self.clock.advance(STEP_S + stall + actor.sleep)
            note = " CRASH" if crash else ""
            if stall:
                note += f" after a stall of {stall:g}s"
            self.trace.append(f"{self.steps:4d} t={self.clock.now - 1_800_000_000.0:9.2f} {actor.name:<14}"
                              f"{note} @ {actor.label}")
            actor.crash_next = crash
            if actor.options and not crash:
                actor.answer = self.chooser.option(actor.options)
            self._last = actor
            actor.state = "running"
            self._resume(actor)
            if actor.crashed and actor.state == "done":
                self.trace.append(f"          {actor.name} died")
                for release in actor.on_crash:
                    release()
            elif actor.state == "done":
                outcome = f"raised {type(actor.error).__name__}: {actor.error}" if actor.error else "finished"
                self.trace.append(f"          {actor.name} {outcome}"[:400])
            if self.check is not None:
                self.check()

    def _resume(self, actor: Actor, crash: bool = False) -> None:
        """Run `actor` until its next point or its end (with `crash`: it dies where it waits)."""
        assert actor.glet is not None
        self._running = actor
        try:
            if crash:
                actor.glet.throw(Crash(actor.name))
            else:
                actor.glet.switch()
        finally:
            self._running = None

    def close(self) -> None:
        """Kill every actor still waiting at a point (a schedule that ended with a
        violation): it dies there, as at a crash, so that nothing of it runs later."""
        self._hub = getcurrent()
        for actor in self.actors:
            if actor.state != "done" and actor.glet is not None and actor.glet:
                actor.crashed = True
                self._resume(actor, crash=True)
            actor.state = "done"

    def format_trace(self, last: int | None = None) -> str:
        lines = self.trace if last is None else self.trace[-last:]
        return "\n".join(lines)
