"""`operators/runs.py` and `operators/submit_dir.py` moved to `airflow_sparkpoint.services`;
the former modules stay as deprecated aliases of the same objects."""

from __future__ import annotations

import importlib
import sys

import pytest

pytestmark = pytest.mark.usefixtures("airflow_home")  # the operators package imports Airflow


@pytest.mark.parametrize(("former", "homes"), [
    ("airflow_sparkpoint.operators.runs",
     ("services.runs", "services.retry", "services.submit", "services.processes")),
    ("airflow_sparkpoint.operators.submit_dir", ("services.submit_dir",)),
])
def test_the_former_module_is_a_deprecated_alias(former: str, homes: tuple[str, ...]) -> None:
    modules = [importlib.import_module(f"airflow_sparkpoint.{home}") for home in homes]
    importlib.import_module("airflow_sparkpoint.operators")  # Airflow's first import resets warning capture
    sys.modules.pop(former, None)
    with pytest.warns(DeprecationWarning, match=f"airflow_sparkpoint.{homes[0]}"):
        alias = importlib.import_module(former)
    for name in alias.__all__:
        assert any(getattr(module, name, None) is getattr(alias, name) for module in modules), name
    assert ({"find_claim", "TaskRecord", "signal_tree"} <= set(alias.__all__)
            or "open_submit_dir" in alias.__all__), \
        alias.__all__
