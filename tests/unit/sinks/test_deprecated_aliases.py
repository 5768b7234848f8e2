"""The commit step and the rollback moved to `airflow_sparkpoint.services`; their former
modules (``sinks.commit``, ``sinks.rollback``: earlier docs and DAGs import them) stay as
deprecated aliases of the same functions."""

from __future__ import annotations

import importlib
import sys

import pytest

from airflow_sparkpoint.services import commit, rollback


@pytest.mark.parametrize(("former", "home", "names"), [
    ("airflow_sparkpoint.sinks.commit", commit, ("commit_pending", "Sinks")),
    ("airflow_sparkpoint.sinks.rollback", rollback, ("abort_generation", "abort_stopped_generation")),
])
def test_the_former_module_is_a_deprecated_alias(former: str, home: object, names: tuple[str, ...]) -> None:
    sys.modules.pop(former, None)
    with pytest.warns(DeprecationWarning, match=home.__name__):  # type: ignore[attr-defined]
        alias = importlib.import_module(former)
    assert sorted(alias.__all__) == sorted(names)
    for name in names:
        assert getattr(alias, name) is getattr(home, name), name
