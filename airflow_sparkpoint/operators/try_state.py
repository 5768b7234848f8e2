"""What a try of `SparkpointSubmitOperator` holds while it runs (issue #47: one concern per
class, no class spread over files): the operator keeps one `TryState` per try, which its
deploy-mode modules (`submit_client`, `submit_cluster`) are given and fill in as they start
the driver, and which ``on_kill`` reads to end it. They set no private attribute of the operator;
the Spark provider's hook stays the provider's ``_hook``, which its own execute and kill use.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.follow import StartedRun

__all__ = ["TryState"]


@dataclass(eq=False)
class TryState:
    """One try of a submit task as it runs: `secret_env`, what spark-submit's environment
    gets beside the command line (the store's credentials and the submit token in client
    mode: never on the command line, which is logged); `native_dir`, the driver's RocksDB
    library directory the try set in the operator's ``env_vars`` (the next try of the same
    operator object replaces it, never one the user set); `detached`, a driver launched
    detached that the task has not deferred on yet (``on_kill`` stops its process group);
    `cluster_run`, a cluster-mode run the task follows itself (``on_kill`` cancels, then
    kills it)."""

    secret_env: dict[str, str] = field(default_factory=dict)
    native_dir: str | None = None
    detached: DriverProcess | None = None
    cluster_run: StartedRun | None = None

    def next_try(self) -> TryState:
        """The state of the next try of the same operator object: nothing started yet;
        the RocksDB library directory this try set (`native_dir`) remembered, for the next
        one to replace."""
        return TryState(native_dir=self.native_dir)
