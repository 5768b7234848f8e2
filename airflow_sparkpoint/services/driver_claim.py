"""A driver a submit task started away from it (a detached process group in client
mode, a driver on the cluster) until its generation claim: the launch sequence both deploy
modes run (`record_and_await_claim`: the task's record of the run, the catalog's launch
record, the wait, the record claimed), the wait for the claim and what came of it as a
value (`ClaimOutcome`: claimed, or the task's error text, with what a detached driver said
in its log), which the operator turns into a deferral, a follow or an exception; and the
error of a cluster-mode spark-submit that named no driver (`no_driver_named`). Pure
Python: no Spark, no Airflow (the operator passes its log and its task state store).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, GenerationInfo
from airflow_sparkpoint.services.cluster_manager import ClusterHandle, Submission
from airflow_sparkpoint.services.detached import DriverProcess
from airflow_sparkpoint.services.detached_run import CLAIM_TIMEOUT_S, DetachedRecord
from airflow_sparkpoint.services.driver_errors import DriverOutput, read_log_tail
from airflow_sparkpoint.services.follow import wait_for_claim
from airflow_sparkpoint.services.runs import record_launch

__all__ = ["CLUSTER_LOOK_EVERY", "LOG_TAIL_LINES", "ClaimOutcome", "await_claim", "detached_output",
           "no_driver_named", "record_and_await_claim"]

#: of the driver log's end read for its error (`driver_errors.LOG_TAIL_BYTES`), the last
#: lines that go to the task log
LOG_TAIL_LINES = 60
#: while waiting for the claim, the cluster manager is asked whether the driver is gone
#: every this many looks at the catalog (one a second)
CLUSTER_LOOK_EVERY = 5


@dataclass(frozen=True)
class ClaimOutcome:
    """What came of the wait for a started driver's claim: its `claim`, or None with the
    task's error `message`; `ended`: the driver ended before it claimed (its own error,
    when it reported one, comes first: `operators.driver_errors.run_failure`), else it was
    killed at the bound; `output`: what a detached driver's log said (client mode)."""

    claim: GenerationInfo | None
    message: str = ""
    ended: bool = False
    output: DriverOutput | None = None


def record_and_await_claim(catalog: Catalog, driver: DriverProcess | ClusterHandle, record: DetachedRecord,
                           *, job: str, store: Any, retention: Any, log: Any,
                           publish: Callable[[GenerationInfo], None]) -> ClaimOutcome:
    """The launch sequence of `driver`, just started away from the task with the submit
    token and ``since`` of `record` (the task's record of the run): `record` saved to the
    task state `store` at once (a lost worker's retry finds the driver; kept for
    `retention`), where the driver runs written to the catalog's launch record
    (`services.runs.record_launch`, what ``sparkpoint status`` shows; a failure `log`ged),
    its claim awaited (`await_claim`), then `publish`ed and the record saved claimed.
    Returns what came of the wait; never raises for the run's outcome."""
    record.save(store, log, retention=retention)
    token, since = record["token"], record["since"]
    message = record_launch(catalog, token, deploy_mode=driver.deploy_mode, driver=driver.launch_json())
    if message:
        log.warning("%s", message)
    outcome = await_claim(catalog, driver, job=job, token=token, since=since, log=log)
    if outcome.claim is not None:
        publish(outcome.claim)
        record.claimed(outcome.claim.generation).save(store, log, retention=retention)
    return outcome


def await_claim(catalog: Catalog, driver: DriverProcess | ClusterHandle, *, job: str, token: str,
                since: int, log: Any) -> ClaimOutcome:
    """Wait for the generation claim of `driver`, started with submit token `token`
    (`follow.wait_for_claim`, `CLAIM_TIMEOUT_S`; the cluster manager asked every
    `CLUSTER_LOOK_EVERY` looks); a driver that claimed nothing in time is killed there and
    the kill `log`ged as an error. Never raises for the run's outcome."""
    cluster = isinstance(driver, ClusterHandle)
    waited = wait_for_claim(catalog, token, since, driver, timeout_s=CLAIM_TIMEOUT_S,
                            look_every=CLUSTER_LOOK_EVERY if cluster else 1, warn=log.warning)
    if waited.claim is not None:
        return ClaimOutcome(waited.claim)
    if waited.why == "timeout":
        log.error("stopping job %s: %s", job, waited.killed)
        if cluster:
            return ClaimOutcome(None, f"job {job!r}: the driver ({driver.describe()}) claimed no generation "
                                      f"within {CLAIM_TIMEOUT_S:.0f} s; killed it")
        return ClaimOutcome(None, f"job {job!r}: the detached driver claimed no generation within "
                                  f"{CLAIM_TIMEOUT_S:.0f} s; stopped it ({driver.describe()})")
    if isinstance(driver, ClusterHandle):
        # the read that judged it ended, not a new one (which may contradict it)
        seen = driver.seen.detail if driver.seen is not None else "no state read"
        return ClaimOutcome(None, f"job {job!r}: the driver ({driver.describe()}) ended before it claimed a "
                                  f"generation ({seen}); its output is the cluster's log of it", ended=True)
    return ClaimOutcome(None, f"job {job!r}: the detached spark-submit ended before its driver claimed a "
                              f"generation (its output: {driver.log})", ended=True,
                        output=detached_output(driver.log, log))


def detached_output(log_path: str, log: Any) -> DriverOutput:
    """What a detached driver said about its failure, from the end of its log file; its
    last lines are `log`ged (a detached driver's output is not in the task log otherwise)."""
    output = DriverOutput()
    try:
        lines = list(output.watch(read_log_tail(log_path)))
    except OSError as exc:
        log.warning("cannot read the detached driver's output %s: %s", log_path, exc)
        return output
    log.info("the detached driver's last output lines (%s):\n%s", log_path,
             "\n".join(lines[-LOG_TAIL_LINES:]))
    return output


def no_driver_named(job: str, kind: str, submission: Submission, mask: Callable[[str], str]) -> str:
    """The task's error when a cluster-mode spark-submit on `kind` named no driver: its exit
    and its last output lines, `mask`ed of secrets."""
    tail = "\n".join(mask(line) for line in submission.tail)
    ended = f"failed (exit {submission.exit_code})" if submission.exit_code else "ended"
    return (f"job {job!r}: spark-submit in cluster mode on {kind} {ended} without naming the driver (read "
            f"from its INFO output: keep the log4j2 level of org.apache.spark.deploy at INFO or lower); its "
            f"last output:\n{tail}")
