"""
### Blue-green deploy of a stateful streaming job via a savepoint

The blue job (``jobs/keyed_totals.py --version 1``) is running. This DAG deploys the new
code (green, ``--version 2``) from a consistent cut of blue's state and either promotes
green or rolls back to blue. The Delta table never shows green's output unless green
was healthy and approved; nothing is lost or counted twice either way.

0. **preflight_green** – before anything touches blue: green's application is restored
   from blue's newest completed checkpoint under a scratch identity (its own storage
   root, job name and output table) and runs a batch; if Spark cannot restore blue's
   state with green's code (a changed state schema, changed operators, a refused
   rescale) the task fails with Spark's error and the deploy ends there, blue still
   running, untouched (`SparkpointPreflightOperator`; see docs/howto/blue-green.md).
1. **stop_blue** – stop-with-savepoint: blue stops between micro-batches, takes a
   savepoint, commits its output and exits. (A blue that is not running gets a savepoint
   from its latest completed checkpoint.)
2. **start_green** – green restores the savepoint with ``commit_mode="external"``: it
   processes everything that arrived since (``availableNow``) and *stages* its output.
3. **green_healthy** – at least ``HEALTHY_CHECKPOINTS`` completed checkpoints of green's
   generation. **audit_green** – a data-quality check of green's staged rows.
4. **decide** – publish if green ran, is healthy and the audit approved; else roll back.
5. Publish: **publish_green** commits green's staged output (two-phase commit).
   Roll back: **abort_green** discards everything green staged, **restore_blue** starts
   the old code again from the *same* savepoint, and **rolled_back** fails the run so the
   failed deploy alerts like any other failure.

**Zero-downtime** (param ``zero_downtime``, docs/howto/blue-green.md): instead of steps
1–5, green warms up *beside* a running blue and takes the job over at an agreed batch,
so the output does not stop for green's start (exactly once: blue commits through batch
N, green from N+1; a second driver runs meanwhile). Blue must run with
``processingTime``, ``commit_mode="checkpoint"`` and a source that can be read twice.

0. **preflight_zero_downtime** – the same pre-flight, then the cutover is planned
   (``SparkpointPreflightOperator(zero_downtime=True)``): XComs ``cutover_id`` and
   ``green_conf``.
1. **start_green_zero_downtime** – green with blue's production arguments plus
   ``green_conf``: a shadow that replays blue's own batches from blue's newest
   checkpoint, then the job itself from N+1 on (it runs on, as blue did, until stopped).
2. **cutover** – ``SparkpointCutoverOperator``: waits until green is within two batches
   of blue, agrees N, asks blue to stop after N (blue's task ends ``stopped``), waits for
   green's claim and first commit. Each step is in its log; the checkpoints page shows
   the cutover's state. Deferrable: it holds no worker slot while it waits (the triggerer
   looks; each step's write is the task's, on a worker).
3. If the cutover is called off, **restore_blue_after_cutover** starts blue's code again
   with ``restore=latest`` when blue had already stopped (its own lineage at N: exact);
   a blue still running is left alone. The run then fails, as a rolled-back deploy does.

Green has to prove itself on new input: with nothing new since the savepoint it stages
nothing, cannot reach the healthy checkpoints, and the deploy rolls back.

Results flow as XComArgs: the savepoint URI (``stop_blue.output``) is what green and
the rollback restore; green's generation (``start_green.output["generation"]``, also
published under the XCom key ``generation`` when green fails) is what the health check
watches and the rollback aborts — never "the newest generation", which another run may
hold.

Storage: the ``sparkpoint_default`` connection; Spark: ``spark_default`` and the
cluster's ``spark-defaults.conf``; Spark's live checkpoint under ``$SPARKPOINT_WORK_DIR``
when set.

Params: ``job_name`` (blue's pipeline name), ``input``, ``output``, ``blue_trigger``
(``availableNow`` drains and finishes; ``processingTime:<interval>`` keeps the restored
blue running in this task), ``reject_audit`` and ``green_fail_after_batch`` (exercise
the rollback: reject green, or make green raise after that batch id), ``preflight``
(default true; false skips step 0, e.g. to rehearse only the rollback), ``zero_downtime``
(default false), ``green_trigger`` and ``cutover_dir`` (green's trigger and scratch
root on the zero-downtime path).
"""

from __future__ import annotations

import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, Param, TriggerRule, XComArg, task
from airflow.sdk.exceptions import AirflowFailException

from airflow_sparkpoint.hooks import SparkpointHook
from airflow_sparkpoint.operators import (
    SparkpointCommitOperator,
    SparkpointCutoverOperator,
    SparkpointPreflightOperator,
    SparkpointSavepointOperator,
    SparkpointSubmitOperator,
)
from airflow_sparkpoint.sensors import SparkpointCheckpointSensor

JOB_SCRIPT = str(Path(__file__).parent / "jobs" / "keyed_totals.py")
STORAGE = "sparkpoint_default"  # the sparkpoint connection: storage root, S3 endpoint, credentials
DATA = "/opt/sparkpoint/data/blue-green"
HEALTHY_CHECKPOINTS = 2  # completed checkpoints green must reach before it can be published
log = logging.getLogger(__name__)


def _job_args(version: int, *extra: str) -> list[str]:
    paths = ["--input", "{{ params.input }}", "--output", "{{ params.output }}"]
    return [*paths, "--version", str(version), *extra]


with DAG(
    dag_id="example_sparkpoint_blue_green",
    description="Savepoint blue, start green from it, publish green or roll back to blue",
    doc_md=__doc__,
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["sparkpoint", "example", "savepoint", "blue-green"],
    params={
        "job_name": Param("blue_green_totals", type="string", description="pipeline name of the blue job"),
        "input": Param(f"{DATA}/input", type="string", description="the job's input (JSON lines)"),
        "output": Param(f"{DATA}/totals", type="string", description="the Delta table it merges into"),
        "blue_trigger": Param("availableNow", type="string",
                              description="blue's trigger after a rollback (or processingTime:<interval>)"),
        "reject_audit": Param(False, type="boolean", description="the audit rejects green (rollback drill)"),
        "green_fail_after_batch": Param(-1, type="integer",
                                        description="green fails after this batch (drill); -1: never"),
        "preflight": Param(True, type="boolean",
                           description="restore green from blue's newest checkpoint in "
                                       "scratch before stopping blue"),
        "zero_downtime": Param(False, type="boolean",
                               description="warm green up beside blue and hand over at an agreed batch "
                                           "(no output gap) instead of stop-savepoint-start"),
        "green_trigger": Param("processingTime:5 seconds", type="string",
                               description="green's trigger on the zero-downtime path (blue's, usually)"),
        "cutover_dir": Param(f"{DATA}/cutover", type="string",
                             description="green's scratch catalogs on the zero-downtime path"),
    },
) as dag:
    common: dict[str, Any] = {"job_name": "{{ params.job_name }}", "sparkpoint_conn_id": STORAGE}
    work_dir = os.environ.get("SPARKPOINT_WORK_DIR") or None

    preflight_green = SparkpointPreflightOperator(
        task_id="preflight_green",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        # green's code and arguments, without the simulated runtime fault: the pre-flight
        # asks whether green can read blue's state, the health gate whether green runs well
        application_args=_job_args(2),
        output_args={"--output": "{scratch}/totals"},  # never blue's table
        work_dir=work_dir,
        retries=0,
        **common,
    )

    @task.branch
    def deploy_path(params: Any = None) -> list[str]:
        """The zero-downtime path, or stop-savepoint-start with or without the pre-flight."""
        if params["zero_downtime"]:
            return ["preflight_zero_downtime"]
        return ["preflight_green", "stop_blue"] if params["preflight"] else ["stop_blue"]

    # NONE_FAILED: after a passed or a skipped pre-flight; never after a refused one, which
    # leaves blue running
    stop_blue = SparkpointSavepointOperator(task_id="stop_blue", stop=True, timeout="10 minutes",
                                            trigger_rule=TriggerRule.NONE_FAILED, **common)
    path = deploy_path()
    path >> preflight_green >> stop_blue
    path >> stop_blue

    # -- the zero-downtime path -----------------------------------------------------------
    preflight_zero_downtime = SparkpointPreflightOperator(
        task_id="preflight_zero_downtime",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=_job_args(2),
        output_args={"--output": "{scratch}/totals"},
        work_dir=work_dir,
        zero_downtime=True,
        cutover_dir="{{ params.cutover_dir }}",  # green's scratch catalog: where green's driver reaches
        retries=0,
        **common,
    )
    start_green_zero_downtime = SparkpointSubmitOperator(
        task_id="start_green_zero_downtime",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=_job_args(2),
        sparkpoint_conf=XComArg(preflight_zero_downtime, key="green_conf"),  # the cutover's shadow
        trigger="{{ params.green_trigger }}",
        work_dir=work_dir,
        retries=0,
        **common,
    )
    cutover = SparkpointCutoverOperator(
        task_id="cutover",
        cutover_id=XComArg(preflight_zero_downtime, key="cutover_id"),
        cutover_within="10 minutes",
        deferrable=True,  # the waits in the triggerer; a task stopped while deferred calls it off
        retries=0,
        **common,
    )

    @task.short_circuit(trigger_rule=TriggerRule.ONE_FAILED)
    def blue_stopped(params: Any = None) -> bool:
        """After a called-off cutover: restart blue only if it no longer runs (it had
        stopped after the agreed batch); a blue still running is left alone."""
        from airflow_sparkpoint.services.history import live_status

        live = live_status(SparkpointHook(STORAGE).get_catalog(params["job_name"]), 60.0)
        log.warning("cutover called off; blue %s", "still runs" if live else "stopped: restoring it")
        return live is None

    restore_blue_after_cutover = SparkpointSubmitOperator(
        task_id="restore_blue_after_cutover",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=_job_args(1),
        restore="latest",  # blue's own lineage at the agreed batch: nothing lost or repeated
        trigger="{{ params.blue_trigger }}",
        work_dir=work_dir,
        retries=0,
        **common,
    )

    @task(trigger_rule=TriggerRule.ONE_FAILED)
    def cutover_called_off() -> None:
        raise AirflowFailException("the zero-downtime cutover was called off (see the cutover task's log)")

    path >> preflight_zero_downtime >> [start_green_zero_downtime, cutover]
    checked = blue_stopped()
    cutover >> checked >> restore_blue_after_cutover
    cutover >> cutover_called_off()

    start_green = SparkpointSubmitOperator(
        task_id="start_green",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=_job_args(2, "--fail-after-batch", "{{ params.green_fail_after_batch }}"),
        restore=stop_blue.output,
        trigger="availableNow",
        commit_mode="external",  # stage only: nothing is visible before publish_green
        work_dir=work_dir,
        retries=0,  # an unhealthy green is rolled back, not retried
        **common,
    )

    green_healthy = SparkpointCheckpointSensor(
        task_id="green_healthy",
        generation=start_green.output["generation"],
        min_checkpoints=HEALTHY_CHECKPOINTS,
        poke_interval=10,
        timeout=600,
        **common,
    )

    @task
    def audit_green(green: dict[str, Any], params: Any = None) -> dict[str, Any]:
        """Check green's staged rows against what readers see now."""
        hook = SparkpointHook(STORAGE)
        staged = hook.staged_rows(params["job_name"], generation=green["generation"])
        published = {row["user"]: row for row in hook.delta_rows(params["output"])}
        problems = []
        if not staged:
            problems.append("green staged no rows")
        for row in staged:
            before = published.get(row["user"])
            if row["user"] is None or row["total"] is None:
                problems.append(f"incomplete row {row}")
            elif before is not None and row["events"] < before["events"]:
                problems.append(f"user {row['user']}: events went back from {before['events']} "
                                f"to {row['events']} (was blue's state restored?)")
            if row["code_version"] != 2:
                problems.append(f"user {row['user']}: code_version {row['code_version']}, expected 2")
        if params["reject_audit"]:
            problems.append("rejected on request (reject_audit=true)")
        log.info("audit of green generation %s: %d staged rows, problems: %s",
                 green["generation"], len(staged), problems)
        return {"approved": not problems, "problems": problems, "rows": len(staged)}

    @task.branch(trigger_rule=TriggerRule.ALL_DONE)
    def decide(ti: Any = None, params: Any = None) -> str | list[str]:
        """Publish only if green ran, is healthy and the audit approved; else roll back.
        Runs whatever happened upstream (ALL_DONE): a failed task leaves no result."""
        if params["zero_downtime"]:
            return []  # the zero-downtime path has its own end
        if params["preflight"] and not ti.xcom_pull(task_ids="preflight_green"):
            raise AirflowFailException("the pre-flight refused green (see preflight_green's log): "
                                       "blue was not stopped and keeps running; nothing to publish or "
                                       "roll back")
        if not ti.xcom_pull(task_ids="stop_blue"):
            raise AirflowFailException("stop_blue failed: no savepoint to deploy from or to roll back to")
        green = ti.xcom_pull(task_ids="start_green")
        healthy = ti.xcom_pull(task_ids="green_healthy")
        audit = ti.xcom_pull(task_ids="audit_green")
        if green and healthy and audit and audit["approved"]:
            return "publish_green"
        if not green:
            reason = "green failed"
        elif not healthy:
            reason = f"green did not reach {HEALTHY_CHECKPOINTS} healthy checkpoints"
        else:
            reason = f"the audit rejected green: {audit['problems']}" if audit else "the audit failed"
        ti.xcom_push(key="reason", value=reason)
        # The generation green ran, published by its task even when it failed.
        generation = ti.xcom_pull(task_ids="start_green", key="generation")
        log.warning("rolling back green (generation %s): %s", generation, reason)
        if generation is None:
            return "restore_blue"  # green never started a run: it staged nothing
        return "abort_green"

    publish_green = SparkpointCommitOperator(task_id="publish_green", **common)

    abort_green = SparkpointCommitOperator(
        task_id="abort_green",
        abort_generation=XComArg(start_green, key="generation"),
        # green may have failed (decide() chose this); but never after a failed decide()
        # (a refused pre-flight, a failed stop_blue): then green never ran and blue's job
        # must not be touched
        trigger_rule=TriggerRule.ALL_DONE_MIN_ONE_SUCCESS,
        **common,
    )

    restore_blue = SparkpointSubmitOperator(
        task_id="restore_blue",
        conn_id="spark_default",
        application=JOB_SCRIPT,
        application_args=_job_args(1),
        restore=stop_blue.output,  # the same savepoint green started from
        trigger="{{ params.blue_trigger }}",
        work_dir=work_dir,
        # On Airflow 3.3+ a retry restores the newest checkpoint of this task's own tries
        # (none: the savepoint again), never green's (choose_restore). Older releases keep
        # no task state: there, roll back again with a new run instead of a retry.
        retries=0,
        trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS,
        **common,
    )

    @task
    def rolled_back(savepoint: str, ti: Any = None) -> None:
        reason = ti.xcom_pull(task_ids="decide", key="reason")
        raise AirflowFailException(f"deploy rolled back ({reason}); blue was restored from {savepoint}")

    checks = [green_healthy, audit_green(start_green.output)]
    branch = decide()
    checks >> branch >> [publish_green, abort_green, restore_blue]
    abort_green >> restore_blue
    restore_blue >> rolled_back(stop_blue.output)
