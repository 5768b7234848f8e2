"""A try of a submit task, prepared before spark-submit runs (issue #47: the operator is
an adapter over this): the job's submit settings as the operator renders them
(`SubmitSettings`), what the try restores and why (`services.retry.plan_try`), its
``spark.sparkpoint.*`` settings (`services.submit.sparkpoint_conf`), its start
(`PreparedTry.start`: refused while another task's run is live, then its submit token
recorded in the task's record) and the Spark conf spark-submit gets; a restore drill's
try is the same under the drill's identity (`DrillSettings`). Pure Python: no Spark, no
Airflow.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.drill import drill_conf
from airflow_sparkpoint.services.retry import TryPlan, choose_restore, plan_try
from airflow_sparkpoint.services.submit import sparkpoint_conf

__all__ = ["DrillSettings", "PreparedTry", "SubmitSettings"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class SubmitSettings:
    """The settings of a job's submit as its task renders them: the `job` and the `task`
    (its id), the store (`storage_uri`, `storage_options`), the restore targets (`restore`
    for the first try, a hand-chosen `restore_snapshot` for every try), the run's own
    settings, the user's Spark conf (`spark_conf`) and the further ``spark.sparkpoint.*``
    settings (`extra`: the operator's ``sparkpoint_conf``). Nothing is validated here: the
    submit's parameters are checked when the DAG is parsed (`services.submit.check_parameters`)
    and its settings when a try is prepared (`conf`)."""

    job: str
    task: str
    storage_uri: str
    storage_options: Mapping[str, Any]
    # no defaults: the operator's parameters are their one home
    restore: str
    restore_snapshot: Any
    trigger: str
    checkpoint_interval: Any
    num_retained: int
    commit_mode: str
    work_dir: str | None
    state_partitions: int | None
    takeover: bool
    spark_conf: Mapping[str, Any]
    extra: Mapping[str, Any]

    def choose_restore(self, try_number: int, catalog: Catalog | None = None,
                       own_generations: Sequence[int] | None = None) -> str:
        """What try `try_number` restores (`services.retry.choose_restore`: `restore` on the
        first try, then the latest retained checkpoint of the task's own tries;
        `restore_snapshot` on every try).

        :raises ConfigError: `restore_snapshot` is not a path.
        """
        return choose_restore(try_number, restore=self.restore, restore_snapshot=self.restore_snapshot,
                              catalog=catalog, own_generations=own_generations,
                              storage_options=self.storage_options)

    def conf(self, restore: str) -> dict[str, str]:
        """The ``spark.sparkpoint.*`` settings of a submit restoring `restore`
        (`services.submit.sparkpoint_conf`).

        :raises ConfigError: a setting is invalid (before anything is submitted).
        """
        return sparkpoint_conf(
            storage_uri=self.storage_uri, storage_options=self.storage_options,
            job=self.job, restore=restore, trigger=self.trigger,
            checkpoint_interval=self.checkpoint_interval,
            num_retained=self.num_retained, commit_mode=self.commit_mode, work_dir=self.work_dir,
            state_partitions=self.state_partitions, takeover=self.takeover, conf=self.spark_conf,
            extra=self.extra)

    def prepare(self, catalog: Catalog, store: Any, try_number: int, *, logger: Any = None) -> PreparedTry:
        """Try `try_number`'s plan (`services.retry.plan_try` with `choose_restore`, its lines
        logged to `logger`, default this module's) and its settings (`conf`), from the task's
        record in Airflow's task state `store` (None: none) and the `catalog`.

        :raises ConfigError: `restore_snapshot` is not a path, or a setting is invalid.
        :raises StorageError: the store cannot be read.
        """
        plan = plan_try(catalog, store, try_number=try_number, job=self.job, task=self.task,
                        restore=self.restore, restore_snapshot=self.restore_snapshot,
                        choose=self.choose_restore)
        for line in plan.lines:
            (logger or log).info("%s", line)
        return PreparedTry(self, plan, self.conf(plan.restore))


@dataclass(frozen=True, kw_only=True)
class DrillSettings(SubmitSettings):
    """A restore drill's submit settings (`services.drill`): the job's, with its store the
    drill's scratch root, every try restoring the drilled `snapshot` (None: not resolved
    yet), under the drill's own job name `drill_job` and live location `work`
    (`services.drill.drill_conf`)."""

    snapshot: str | None = None
    drill_job: str = ""
    work: str | None = None

    @classmethod
    def of(cls, submit: SubmitSettings, *, snapshot: str | None, drill_job: str,
           work: str | None) -> DrillSettings:
        """`submit`'s settings as a drill's of `snapshot`."""
        given = {item.name: getattr(submit, item.name) for item in fields(SubmitSettings)}
        return cls(**given, snapshot=snapshot, drill_job=drill_job, work=work)

    def choose_restore(self, try_number: int, catalog: Catalog | None = None,
                       own_generations: Sequence[int] | None = None) -> str:
        """Every try restores the drilled snapshot (into a fresh scratch directory).

        :raises ConfigError: the snapshot is not resolved yet.
        """
        if self.snapshot is None:
            raise ConfigError("the drilled snapshot is resolved in execute()")
        return self.snapshot

    def conf(self, restore: str) -> dict[str, str]:
        """The submit's settings as the drill's (`services.drill.drill_conf`).

        :raises ConfigError: a setting is invalid.
        """
        return drill_conf(super().conf(restore), drill_job=self.drill_job, work=self.work)


@dataclass(frozen=True)
class PreparedTry:
    """A try ready to start: the job's `submit` settings, the try's `plan` (what it restores
    and why) and its ``spark.sparkpoint.*`` `settings`."""

    submit: SubmitSettings
    plan: TryPlan
    settings: dict[str, str]

    @property
    def since(self) -> int:
        """The newest generation before this try: its run is looked for among newer ones."""
        return self.plan.since

    @property
    def own(self) -> list[int] | None:
        """The generations the task's earlier tries ran (None: not known)."""
        return self.plan.own

    @property
    def spark_conf(self) -> dict[str, Any]:
        """The Spark conf spark-submit gets: the user's with this try's settings."""
        return {**self.submit.spark_conf, **self.settings}

    def again(self, catalog: Catalog, store: Any, *, logger: Any = None) -> PreparedTry:
        """The same try prepared anew (`SubmitSettings.prepare`): after a run of the task
        ended that was live when it was prepared, whose last checkpoint now counts.

        :raises ConfigError: a setting is invalid.
        :raises StorageError: the store cannot be read.
        """
        return self.submit.prepare(catalog, store, self.plan.try_number, logger=logger)

    def start(self, catalog: Catalog, starter: AirflowTry, *, store: Any, retention: Any = None) -> str:
        """Start the try (`services.retry.TryPlan.start`: refused while another task's run is
        live unless the settings' ``takeover``; the driver checks again, the same rule,
        before its claim), its new submit token recorded in the task's record in `store`
        (kept for `retention`). Returns the token.

        :raises JobAlreadyRunning: another task's run is live and not ``takeover``.
        :raises CutoverInProgress: a cutover of the job is open.
        """
        return self.plan.start(catalog, starter, takeover=self.submit.takeover, settings=self.settings,
                               store=store, retention=retention)
