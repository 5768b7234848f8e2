"""Durations: the one parser of every duration the package takes.

A duration is a `datetime.timedelta`, a number of seconds (int or float, not bool) or a
string: a bare number of seconds, Spark's time-conf forms (``500ms``, ``2s``, ``10min``,
``1h``, ``2d``) or Spark's interval syntax as in ``trigger(processingTime=...)``
(``500 milliseconds``, ``5 seconds``, ``interval 1 minute 30 seconds``). Months and
years are not fixed durations and are refused.

Operator and sensor arguments (`seconds`, `optional_seconds`), ``spark.sparkpoint.*``
conf values (`runtime.config.parse_duration`) and CLI options all go through here.
Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import Any

from airflow_sparkpoint.exceptions import ConfigError

__all__ = ["FORMS", "conf_text", "optional_seconds", "parse_text", "seconds"]

_UNIT_SECONDS: dict[str, float] = {}
for _names, _factor in (
    (("us", "microsecond", "microseconds"), 1e-6),
    (("ms", "milli", "millis", "millisecond", "milliseconds"), 1e-3),
    (("s", "sec", "secs", "second", "seconds"), 1.0),
    (("m", "min", "mins", "minute", "minutes"), 60.0),
    (("h", "hr", "hrs", "hour", "hours"), 3600.0),
    (("d", "day", "days"), 86400.0),
    (("w", "week", "weeks"), 604800.0),
):
    _UNIT_SECONDS.update(dict.fromkeys(_names, _factor))
_DURATION_RE = re.compile(r"^(?:\s*\d+(?:\.\d+)?\s*[a-z]*)+\s*$")
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*([a-z]*)")
#: the accepted string forms, for error messages
FORMS = ("e.g. '0', '500ms', '2s', '10min', '1h', or Spark's '500 milliseconds', '5 seconds', "
         "'1 minute 30 seconds'")


def parse_text(text: str) -> float:
    """Seconds of a duration string (see the module docstring).

    :raises ValueError: not a duration; the message says why (months/years, or the forms).
    """
    body = str(text).strip().lower().removeprefix("interval ")
    parts = _PART_RE.findall(body) if _DURATION_RE.match(body) else []
    units = [unit for _, unit in parts]
    if any(unit.startswith(("month", "mon", "year", "yr")) for unit in units):
        raise ValueError(f"uses months or years, which are not fixed durations; expected {FORMS}")
    bare = len(parts) == 1 and not units[0]
    if (not parts
            or (not bare and (not all(unit in _UNIT_SECONDS for unit in units)
                              or len(set(units)) < len(units)))):
        raise ValueError(f"is not a duration; expected a timedelta, a number of seconds or {FORMS}")
    return sum(float(number) * (_UNIT_SECONDS[unit] if unit else 1.0) for number, unit in parts)


def optional_seconds(name: str, value: Any, *, allow_zero: bool = False) -> float | None:
    """`value` (a timedelta, a number or a duration string) as finite seconds > 0 (>= 0
    with `allow_zero`); None stays None.

    :raises ConfigError: anything else; the message names `name` and the value.
    """
    if value is None:
        return None
    if isinstance(value, timedelta):
        number: Any = value.total_seconds()
    elif isinstance(value, str):
        try:
            number = parse_text(value)
        except ValueError as exc:
            raise ConfigError(f"{name}={value!r} is invalid: it {exc}") from None
    else:
        number = value
    bound = ">= 0" if allow_zero else "> 0"
    if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number) or \
            (number < 0 if allow_zero else number <= 0):
        raise ConfigError(f"{name}={value!r} is invalid; expected a duration {bound}: "
                          "a timedelta, a number of "
                          f"seconds or {FORMS}")
    return float(number)


def seconds(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """`optional_seconds` for a required duration.

    :raises ConfigError: `value` is None or not a duration (the message names `name`).
    """
    result = optional_seconds(name, value, allow_zero=allow_zero)
    if result is None:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name}=None is invalid; expected a duration {bound}: a timedelta, a number of "
                          f"seconds or {FORMS}")
    return result


def conf_text(value: float) -> str:
    """`value` seconds as a conf string `parse_text` reads back exactly (``30s``, ``0.5s``)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return f"{text}s"
