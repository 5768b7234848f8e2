"""Modules renamed so that a newcomer can guess them (issue #47) keep their former import
paths as deprecated aliases that re-export every public name of the new home."""

from __future__ import annotations

import importlib
import sys

import pytest

RENAMED = {
    "airflow_sparkpoint.runtime.inspect": "airflow_sparkpoint.runtime.state_inspect",
    "airflow_sparkpoint.sinks.kinds": "airflow_sparkpoint.sinks.registry",
    "airflow_sparkpoint.runtime.reach": "airflow_sparkpoint.runtime.executor_reach",
    "airflow_sparkpoint.checkpoints.targets": "airflow_sparkpoint.checkpoints.snapshot_open",
    "airflow_sparkpoint.checkpoints.records": "airflow_sparkpoint.checkpoints.history_records",
    "airflow_sparkpoint.checkpoints.entries": "airflow_sparkpoint.checkpoints.catalog_types",
}


@pytest.mark.parametrize(("former", "home"), sorted(RENAMED.items()))
def test_the_former_module_is_a_deprecated_alias_of_its_new_home(former: str, home: str) -> None:
    new = importlib.import_module(home)
    sys.modules.pop(former, None)
    with pytest.warns(DeprecationWarning, match=home):
        alias = importlib.import_module(former)
    assert sorted(alias.__all__) == sorted(new.__all__)
    for name in new.__all__:
        assert getattr(alias, name) is getattr(new, name), name
