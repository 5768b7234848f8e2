"""Which run is whose: the generation a submit started (found by its token), its status,
its error and its result, and the task try that started it.

A driver records the token of the submit that started it (``SPARKPOINT_SUBMITTER``)
in its generation claim, with its application id and UI URL. Reading "the newest
generation" instead would race with any other run of the job (a cleared task's
previous try, a retry, a blue-green rollback). The record a task keeps across its tries
is `services.retry.TaskRecord`. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, GenerationInfo
from airflow_sparkpoint.checkpoints.history_records import AirflowTry
from airflow_sparkpoint.checkpoints.launches import LaunchRecord, describe_driver, read_launch, write_launch
from airflow_sparkpoint.checkpoints.run_result import ERROR_LINE, parse_error_line, read_run_result
from airflow_sparkpoint.checkpoints.status import JobStatus, read_job_status
from airflow_sparkpoint.exceptions import CorruptMetadata, SparkpointError

__all__ = [
    "ERROR_LINE", "AirflowTry", "GenerationInfo", "LaunchRecord", "RunClaim", "RunWatcher", "claim_json",
    "committed_batches",
    "describe_driver", "find_claim", "launch_of", "new_token", "parse_error_line", "read_result",
    "record_launch", "reported_error", "run_status", "task_try",
]

log = logging.getLogger(__name__)


def new_token() -> str:
    """A new submit token (what the driver records as ``SPARKPOINT_SUBMITTER``)."""
    return uuid.uuid4().hex


#: a generation's claim record, as the driver wrote it when it started (the one type of
#: that record, `GenerationInfo`; this name is kept for callers of `find_claim`)
RunClaim = GenerationInfo


def claim_json(claim: GenerationInfo) -> dict[str, Any]:
    """The run a submit task publishes (XCom ``spark_application``): generation,
    application id, UI URL, host, pid and start time."""
    return {"generation": claim.generation, "app": claim.app, "ui": claim.ui, "host": claim.host,
            "pid": claim.pid, "started_at": claim.started_at}


def find_claim(catalog: Catalog, token: str, *, after: int = 0) -> GenerationInfo | None:
    """The generation newer than `after` whose driver recorded `token`, or None (an
    unreadable claim is skipped).

    :raises StorageError: the store cannot be listed or read.
    """
    for generation in (g for g in catalog.generations() if g > after):
        try:
            claim = catalog.generation_claim(generation)
        except CorruptMetadata as exc:
            log.debug("generation %d of job %s: unreadable claim (%s)", generation, catalog.job, exc)
            continue
        if claim is not None and claim.submitter == token:
            return claim
    return None


def record_launch(catalog: Catalog, token: str, *, deploy_mode: str, driver: Mapping[str, Any]) -> str | None:
    """Write where the submit with token `token` started its driver (`checkpoints.launches`,
    what `sparkpoint status` shows); None, or why it could not (bookkeeping: the run goes on)."""
    try:
        write_launch(catalog, LaunchRecord(token=token, deploy_mode=deploy_mode, driver=dict(driver)))
    except (SparkpointError, ValueError) as exc:
        return f"could not write the launch record of job {catalog.job!r}: {exc}"
    return None


def launch_of(catalog: Catalog, generation: int) -> LaunchRecord | None:
    """Where the driver of `generation` was started (its claim's submit token's launch
    record), or None: no claim, not started by a submit, or no record.

    :raises StorageError: the store cannot be read.
    :raises CorruptRecord: the claim or the launch record is unreadable.
    """
    if generation < 1:
        return None
    claim = catalog.generation_claim(generation)
    if claim is None or not claim.submitter:
        return None
    try:
        return read_launch(catalog, claim.submitter)
    except CorruptMetadata:
        raise
    except ValueError:  # a token that names no launch record (written by hand)
        return None


def run_status(catalog: Catalog, generation: int) -> JobStatus | None:
    """The status record generation `generation` wrote (its own record; ``status.json``
    while it has none, a store written before per-generation records), or None when it
    wrote none.

    :raises StorageError: the store cannot be read.
    """
    status = read_job_status(catalog, generation) or read_job_status(catalog)
    return status if status is not None and status.generation == generation else None


def reported_error(catalog: Catalog, token: str, *, after: int = 0) -> str | None:
    """The error the run of submit `token` recorded when it failed (its own status
    record, `run_status`), or None."""
    try:
        claim = find_claim(catalog, token, after=after)
        status = run_status(catalog, claim.generation) if claim is not None else None
    except SparkpointError as exc:
        log.debug("cannot read the failed run of job %s: %s", catalog.job, exc)
        return None
    if status is None or status.state != "failed":
        return None
    return str(status.error) if status.error else None


def read_result(catalog: Catalog, generation: int) -> dict[str, Any] | None:
    """The run result generation `generation` recorded when it ended (its XCom form), or None.

    :raises CorruptMetadata: the record is unreadable.
    """
    result = read_run_result(catalog, generation)
    return None if result is None else result.to_json()


def committed_batches(result: Mapping[str, Any]) -> list[Any]:
    """The batches a run made durable (its asset event's): those its restore-time recovery
    committed, then those it committed itself (`read_result`'s form)."""
    return [*(result.get("recovered") or {}).get("committed", ()), *result.get("committed_batches", ())]


def task_try(context: Mapping[str, Any], dag_id: str, task_id: str) -> AirflowTry:
    """The task try an Airflow task `context` runs (its map index only when the task is
    mapped); `dag_id`/`task_id`: the operator's, where the task instance does not say."""
    ti = context["ti"]
    index = getattr(ti, "map_index", None)
    return AirflowTry(str(getattr(ti, "dag_id", None) or dag_id),
                      str(getattr(ti, "task_id", None) or task_id),
                      str(context.get("run_id") or getattr(ti, "run_id", "") or ""),
                      int(getattr(ti, "try_number", 1) or 1),
                      int(index) if isinstance(index, int) and index >= 0 else None)


class RunWatcher:
    """While spark-submit runs, look for the generation its driver claims (by token),
    so that the generation and the links are known while a long job runs."""

    def __init__(self, catalog: Catalog, token: str, after: int, found: Callable[[GenerationInfo], None],
                 interval_s: float = 2.0) -> None:
        self._catalog, self._token, self._after, self._found = catalog, token, after, found
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="sparkpoint-run-watcher", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                run = find_claim(self._catalog, self._token, after=self._after)
            except SparkpointError as exc:
                logging.getLogger(__name__).debug("looking for the run failed: %s", exc)
                continue
            if run is not None:
                self._found(run)
                return
