"""``sparkpoint list``, ``status`` and ``metrics``: what the job's history shows (the
read model, `airflow_sparkpoint.checkpoints.history`)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from airflow_sparkpoint.cli.options import common_options, env, open_catalog, positive_seconds
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json, iso, pairs, size, table
from airflow_sparkpoint.exceptions import SparkpointError, UsageError
from airflow_sparkpoint.services.health import load_for_metrics, metric_values, prometheus_text
from airflow_sparkpoint.services.history import (
    PipelineHistory,
    load_history,
    skipped_checkpoints,
    snapshot_records,
)
from airflow_sparkpoint.services.runs import LaunchRecord, launch_of
from airflow_sparkpoint.services.stores import Catalog, other_jobs

__all__ = ["add_list", "add_metrics", "add_status", "cmd_list", "cmd_metrics", "cmd_status",
           "status_document"]

log = logging.getLogger("airflow_sparkpoint.cli")


def add_list(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``list``."""
    p = commands.add_parser("list", parents=[common], help="checkpoints and savepoints, newest first")
    p.set_defaults(func=cmd_list)


def add_status(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``status``."""
    p = commands.add_parser("status", parents=[common], help="generation, liveness and last checkpoint")
    p.add_argument("--max-heartbeat-age", type=positive_seconds, default=60.0, metavar="S",
                   help="a heartbeat older than this means the job is not alive (default: 60)")
    p.set_defaults(func=cmd_status)


def add_metrics(commands: Any) -> None:
    """Register ``metrics`` (its ``--job`` may be repeated)."""
    p = commands.add_parser(
        "metrics", parents=[common_options(many_jobs=True)],
        help="checkpoint health metrics in Prometheus text format (Flink's names)",
        description="Prints each job's checkpoint metrics (docs/CLI.md) in the Prometheus text exposition "
                    "format, for a scraper outside Airflow (e.g. a textfile collector).",
    )
    p.add_argument("--max-heartbeat-age", type=positive_seconds, default=60.0, metavar="S",
                   help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_metrics)


def other_jobs_hint(catalog: Catalog) -> str:
    """`` (jobs under this root: a, b)`` naming up to ten other jobs of the root, or ""."""
    names = other_jobs(catalog)
    return f" (jobs under this root: {', '.join(names[:10])})" if names else ""


# --------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    checkpoints = snapshot_records(catalog, "checkpoint")
    savepoints = snapshot_records(catalog, "savepoint")
    if args.json:
        emit_json({
            "job": catalog.job,
            "root": catalog.uri,
            "checkpoints": [r.to_json() for r in checkpoints],
            "savepoints": [r.to_json() for r in savepoints],
        })
        return EXIT_OK
    if not checkpoints and not savepoints:
        print(f"no checkpoints or savepoints for job {catalog.job!r} under "
              f"{catalog.uri}{other_jobs_hint(catalog)}")
        return EXIT_OK
    rows = []
    for r in [*checkpoints, *savepoints]:
        status = r.short_reason()
        if r.verified_at is not None:  # the last restore drill (`sparkpoint verify`)
            status += (f"; drill FAILED {iso(r.verified_at)}" if r.verify_error
                       else f"; verified {iso(r.verified_at)}")
        rows.append([
            r.kind, r.id, r.batch_id, r.generation, iso(r.created_at), r.duration_ms,
            None if r.bytes_copied is None else size(r.bytes_copied),
            None if r.bytes_total is None else size(r.bytes_total),
            r.file_count, r.uri, status,
        ])
    headers = ["KIND", "ID", "BATCH", "GEN", "CREATED (UTC)", "DURATION_MS", "COPIED", "TOTAL", "FILES",
               "URI", "STATUS"]
    print(table(headers, rows, right=frozenset({1, 2, 3, 5, 6, 7, 8})))
    return EXIT_OK


# --------------------------------------------------------------------------- status


def status_document(history: PipelineHistory, launch: LaunchRecord | None = None) -> dict[str, Any]:
    """`status --json` (docs/CLI.md), from the history model and the current generation's
    launch record (`launch`: where its submit started the driver)."""
    status, latest = history.status, history.latest_completed
    last_checkpoint = None
    if status is not None and status.last_checkpoint_id is not None:
        last_checkpoint = {"id": status.last_checkpoint_id, "uri": status.last_checkpoint_uri}
    view = history.to_json()
    return {
        "job": history.job,
        "root": history.root,
        "generation": history.generation,
        "status_generation": view["status_generation"],
        "state": view["state"],
        "alive": history.alive,
        "heartbeat_age_s": view["heartbeat_age_s"],
        "max_heartbeat_age_s": history.max_heartbeat_age,
        "started": iso(status.started_at) if status is not None else None,
        "last_batch": view["last_batch"],
        "last_checkpoint": last_checkpoint,
        "latest_checkpoint": None if latest is None else {
            "id": latest.id, "uri": latest.uri, "batch_id": latest.batch_id,
            "generation": latest.generation, "created": iso(latest.created_at),
        },
        "checkpoints_completed": status.checkpoints_completed if status is not None else None,
        "savepoint": status.savepoint_uri if status is not None else None,
        "error": view["error"],
        "host": status.host if status is not None else None,
        "pid": status.pid if status is not None else None,
        "application_id": (status.application_id or None) if status is not None else None,
        # added fields (the history model's overview)
        "counts": view["counts"],
        "latest_savepoint": None if view["latest_savepoint"] is None else {
            k: view["latest_savepoint"][k] for k in ("id", "uri", "batch_id", "generation", "created")},
        "latest_restore": None if view["latest_restore"] is None else {
            k: view["latest_restore"][k] for k in ("generation", "restored_from", "started", "airflow")},
        "airflow_try": view["airflow_try"],
        "driver": None if launch is None else {
            **dict(launch.driver), "deploy_mode": launch.deploy_mode, "where": launch.describe(),
            "launched": iso(launch.launched_at)},
    }


def cmd_status(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    history = load_history(catalog, max_heartbeat_age=args.max_heartbeat_age)
    latest = history.latest_completed
    for record in skipped_checkpoints(history):  # what `restore=latest` skips over, as the catalog warns
        log.warning("skipping invalid checkpoint %s: %s", record.uri, record.error)
    try:
        launch = launch_of(catalog, history.generation)
    except SparkpointError as exc:  # bookkeeping: the status shows without it
        log.warning("cannot read the launch record of generation %d: %s", history.generation, exc)
        launch = None
    document = status_document(history, launch)
    if args.json:
        emit_json(document)
        return EXIT_OK
    status, generation, age, alive = history.status, history.generation, history.heartbeat_age, history.alive
    state = document["state"]
    if age is None:
        alive_text = "no (no status record)"
    else:
        alive_text = (f"{'yes' if alive else 'no'} (heartbeat {age:.0f} s ago; "
                      f"max {args.max_heartbeat_age:g} s)")
        if status is not None and status.generation < generation:
            alive_text += f"; superseded by generation {generation}"
    latest_text = None
    if latest is not None:
        latest_text = f"chk-{latest.id} (batch {latest.batch_id}, {iso(latest.created_at)})  {latest.uri}"
    counts = history.counts
    counts_text = (f"{counts.completed} completed, {counts.failed} failed, {counts.in_progress} in progress, "
                   f"{counts.restored} restored" + ("" if counts.lifetime else " (retained history only)"))
    current = history.current
    started_by = None if current is None or current.airflow is None else current.airflow.describe()
    restore = history.latest_restore
    print(pairs([
        ("job", catalog.job),
        ("root", catalog.uri),
        ("generation", generation if generation else "none claimed yet"),
        ("started by", started_by),
        ("driver host", None if status is None or not status.host else
         f"{status.host} pid {status.pid}" + (f", application {status.application_id}"
                                                if status.application_id else "")),
        ("driver", None if launch is None else f"{launch.describe()} ({launch.deploy_mode} mode, launched "
                                               f"{iso(launch.launched_at)})"),
        ("state", f"{state} (generation {status.generation})" if status is not None else state),
        ("alive", alive_text),
        ("last batch", document["last_batch"]),
        ("last checkpoint", latest_text),
        ("checkpoints", counts_text),
        ("last restore", None if restore is None else
         f"generation {restore.generation} from {restore.origin} ({iso(restore.started_at)})"),
        ("savepoint", document["savepoint"]),
        ("error", document["error"]),
    ]))
    if status is None and generation == 0 and latest is None:
        hint = other_jobs_hint(catalog)
        if hint:
            print(f"nothing recorded for job {catalog.job!r}{hint}", file=sys.stderr)
    return EXIT_OK


# --------------------------------------------------------------------------- metrics


def cmd_metrics(args: argparse.Namespace) -> int:
    jobs = list(dict.fromkeys(args.jobs or ([env("SPARKPOINT_JOB")] if env("SPARKPOINT_JOB") else [])))
    if not jobs:
        raise UsageError("--job is required (or set SPARKPOINT_JOB); repeat --job for several jobs")
    histories = []
    for job in jobs:
        catalog = open_catalog(argparse.Namespace(**{**vars(args), "job": job}))
        histories.append(load_for_metrics(catalog, max_heartbeat_age=args.max_heartbeat_age))
    if args.json:  # the same figures as a JSON document
        emit_json({"jobs": [{"job": h.job, "root": h.root, "metrics": metric_values(h)} for h in histories]})
    else:
        sys.stdout.write(prometheus_text(({"job": h.job}, h) for h in histories))
    return EXIT_OK
