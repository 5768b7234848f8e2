"""A fake Airflow task instance for operator tests without a scheduler."""

from __future__ import annotations

from typing import Any

__all__ = ["FakeTI"]


class FakeTI:
    """A task instance: its try number, what was pushed to XCom and, when given, the task
    it runs (`dag_id`, `task_id`, `run_id`, `map_index`; None leaves the operator's own)."""

    def __init__(self, try_number: int = 1, *, dag_id: str | None = None, task_id: str | None = None,
                 run_id: str | None = None, map_index: int | None = None) -> None:
        self.try_number = try_number
        self.dag_id, self.task_id, self.run_id, self.map_index = dag_id, task_id, run_id, map_index
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value
