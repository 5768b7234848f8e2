"""Trend charts of the checkpoints page: geometry of inline SVG line charts.

The page (`page.py`) renders these as inline ``<svg>`` elements, styled by classes of
the page's one hashed style sheet: no script, no external resource, no ``style``
attribute, so the plugin's content security policy holds. Pure Python, no Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["BOTTOM", "HEIGHT", "LEFT", "RIGHT", "SERIES", "TOP", "WIDTH", "Chart", "chart", "charts"]

WIDTH, HEIGHT = 360, 140
#: margins of the plot area inside the SVG (left leaves room for the y labels)
LEFT, RIGHT, TOP, BOTTOM = 64, 8, 20, 22

#: the charted figures of a trend point: (key, title)
SERIES = (("duration_ms", "Checkpoint duration"), ("bytes_copied", "Bytes copied"),
          ("bytes_total", "Total size"))


@dataclass(frozen=True)
class Chart:
    """One line chart: the polyline's points (SVG user units) and its axis labels."""

    key: str
    title: str
    points: tuple[tuple[float, float], ...]
    y_max_label: str
    y_min_label: str
    x_first_label: str
    x_last_label: str
    last_label: str

    @property
    def polyline(self) -> str:
        """The ``points`` attribute of the SVG polyline (``x,y x,y ...``)."""
        return " ".join(f"{x:.1f},{y:.1f}" for x, y in self.points)


def chart(trend: Sequence[Mapping[str, Any]], key: str, title: str, fmt: Callable[[float | None], str],
          when: Callable[[float | None], str]) -> Chart:
    """The chart of `key` over `trend` (oldest first; `PipelineHistory.to_json()["trend"]`).

    x is the completion time (evenly spread by position when all share one time), y
    runs from 0 to the largest value, so a growing line means growing checkpoints.
    """
    values = [float(p[key]) for p in trend]
    times = [float(p["completed_at"]) for p in trend]
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    top = max(values, default=0.0) or 1.0
    first, last = (times[0], times[-1]) if times else (0.0, 0.0)
    span = last - first
    points = []
    for index, (at, value) in enumerate(zip(times, values, strict=True)):
        if span > 0:
            share = (at - first) / span
        else:
            share = index / (len(values) - 1) if len(values) > 1 else 0.5
        points.append((LEFT + share * plot_w, TOP + plot_h - value / top * plot_h))
    return Chart(key=key, title=title, points=tuple(points), y_max_label=fmt(top if values else None),
                 y_min_label=fmt(0), x_first_label=when(first) if times else "-",
                 x_last_label=when(last) if times else "-", last_label=fmt(values[-1]) if values else "-")


def charts(trend: Sequence[Mapping[str, Any]], formats: Mapping[str, Callable[[float | None], str]],
           when: Callable[[float | None], str]) -> list[Chart]:
    """One chart per `SERIES` entry (`formats`: the value formatter of each key)."""
    return [chart(trend, key, title, formats[key], when) for key, title in SERIES]
