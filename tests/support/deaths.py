"""A process killed at a step, played in-process: `Died` is raised where production
would be SIGKILLed (a fault point, a sink's step), and nothing after it runs."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_sparkpoint import faults

__all__ = ["Died", "dies_at", "kill_at"]


class Died(Exception):
    """The process "died" here (its SIGKILL in production)."""


def dies_at(step: str) -> Callable[..., None]:
    """A hook that raises `Died` when called with `step` first (a `CopySink` hook, or
    `faults.maybe_kill` with its batch), and does nothing otherwise."""
    def hook(reached: str, *_: object) -> None:
        if reached == step:
            raise Died(step)
    return hook


def kill_at(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """Make the process "die" at fault point `point` (`faults.maybe_kill`)."""
    monkeypatch.setattr(faults, "maybe_kill", dies_at(point))
