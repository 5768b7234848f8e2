"""The job commands of ``sparkpoint``: list, status, metrics, savepoint, dispose, commit,
demo (the parser and the entry point are in `airflow_sparkpoint.cli`)."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.cli_common import (
    EXIT_FAILURE,
    EXIT_OK,
    CommandFailed,
    UsageError,
    _emit_json,
    _env,
    _iso,
    _lazy,
    _listing,
    _open_catalog,
    _other_jobs_hint,
    _pairs,
    _size,
    _storage_options,
    _table,
)
from airflow_sparkpoint.exceptions import ControlError, RestoreError, StorageError

log = logging.getLogger("airflow_sparkpoint.cli")


# --------------------------------------------------------------------------- list


def cmd_list(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.history import snapshot_records

    catalog = _open_catalog(args)
    checkpoints = snapshot_records(catalog, "checkpoint")
    savepoints = snapshot_records(catalog, "savepoint")
    if args.json:
        _emit_json({
            "job": catalog.job,
            "root": catalog.uri,
            "checkpoints": [r.to_json() for r in checkpoints],
            "savepoints": [r.to_json() for r in savepoints],
        })
        return EXIT_OK
    if not checkpoints and not savepoints:
        print(f"no checkpoints or savepoints for job {catalog.job!r} under {catalog.uri}{_other_jobs_hint(catalog)}")
        return EXIT_OK
    rows = []
    for r in [*checkpoints, *savepoints]:
        status = r.short_reason()
        if r.verified_at is not None:  # the last restore drill (`sparkpoint verify`)
            status += f"; drill FAILED {_iso(r.verified_at)}" if r.verify_error else f"; verified {_iso(r.verified_at)}"
        rows.append([
            r.kind, r.id, r.batch_id, r.generation, _iso(r.created_at), r.duration_ms,
            None if r.bytes_copied is None else _size(r.bytes_copied),
            None if r.bytes_total is None else _size(r.bytes_total),
            r.file_count, r.uri, status,
        ])
    headers = ["KIND", "ID", "BATCH", "GEN", "CREATED (UTC)", "DURATION_MS", "COPIED", "TOTAL", "FILES", "URI",
               "STATUS"]
    print(_table(headers, rows, right=frozenset({1, 2, 3, 5, 6, 7, 8})))
    return EXIT_OK


# --------------------------------------------------------------------------- status


def _status_document(history: Any) -> dict[str, Any]:
    """`status --json` (docs/CLI.md), from the history model."""
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
        "started": _iso(status.started_at) if status is not None else None,
        "last_batch": view["last_batch"],
        "last_checkpoint": last_checkpoint,
        "latest_checkpoint": None if latest is None else {
            "id": latest.id, "uri": latest.uri, "batch_id": latest.batch_id,
            "generation": latest.generation, "created": _iso(latest.created_at),
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
    }


def cmd_status(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.history import load_history

    catalog = _open_catalog(args)
    history = load_history(catalog, max_heartbeat_age=args.max_heartbeat_age)
    latest = history.latest_completed
    for record in history.checkpoints:  # what `restore=latest` skips over, as the catalog warns
        if record.error and "no _metadata" not in record.error and (latest is None or record.id > latest.id):
            log.warning("skipping invalid checkpoint %s: %s", record.uri, record.error)
    document = _status_document(history)
    if args.json:
        _emit_json(document)
        return EXIT_OK
    status, generation, age, alive = history.status, history.generation, history.heartbeat_age, history.alive
    state = document["state"]
    if age is None:
        alive_text = "no (no status record)"
    else:
        alive_text = f"{'yes' if alive else 'no'} (heartbeat {age:.0f} s ago; max {args.max_heartbeat_age:g} s)"
        if status is not None and status.generation < generation:
            alive_text += f"; superseded by generation {generation}"
    latest_text = None
    if latest is not None:
        latest_text = f"chk-{latest.id} (batch {latest.batch_id}, {_iso(latest.created_at)})  {latest.uri}"
    counts = history.counts
    counts_text = (f"{counts.completed} completed, {counts.failed} failed, {counts.in_progress} in progress, "
                   f"{counts.restored} restored" + ("" if counts.lifetime else " (retained history only)"))
    current = history.current
    started_by = None if current is None or current.airflow is None else current.airflow.describe()
    restore = history.latest_restore
    print(_pairs([
        ("job", catalog.job),
        ("root", catalog.uri),
        ("generation", generation if generation else "none claimed yet"),
        ("started by", started_by),
        ("state", f"{state} (generation {status.generation})" if status is not None else state),
        ("alive", alive_text),
        ("last batch", document["last_batch"]),
        ("last checkpoint", latest_text),
        ("checkpoints", counts_text),
        ("last restore", None if restore is None else
         f"generation {restore.generation} from {restore.origin} ({_iso(restore.started_at)})"),
        ("savepoint", document["savepoint"]),
        ("error", document["error"]),
    ]))
    if status is None and generation == 0 and latest is None:
        hint = _other_jobs_hint(catalog)
        if hint:
            print(f"nothing recorded for job {catalog.job!r}{hint}", file=sys.stderr)
    return EXIT_OK


# --------------------------------------------------------------------------- metrics


def cmd_metrics(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.health import load_for_metrics, metric_values, prometheus_text

    jobs = list(dict.fromkeys(args.jobs or ([_env("SPARKPOINT_JOB")] if _env("SPARKPOINT_JOB") else [])))
    if not jobs:
        raise UsageError("--job is required (or set SPARKPOINT_JOB); repeat --job for several jobs")
    histories = []
    for job in jobs:
        catalog = _open_catalog(argparse.Namespace(**{**vars(args), "job": job}))
        histories.append(load_for_metrics(catalog, max_heartbeat_age=args.max_heartbeat_age))
    if args.json:  # the same figures as a JSON document
        _emit_json({"jobs": [{"job": h.job, "root": h.root, "metrics": metric_values(h)} for h in histories]})
    else:
        sys.stdout.write(prometheus_text(({"job": h.job}, h) for h in histories))
    return EXIT_OK


# --------------------------------------------------------------------------- savepoint


def cmd_savepoint(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.checkpoints.savepoints import (
        request_savepoint,
        savepoint_from_latest_checkpoint,
        savepoint_source,
        wait_for_savepoint,
    )

    catalog = _open_catalog(args)
    source = savepoint_source(catalog, args.max_heartbeat_age)
    kind = "stop" if args.stop else "savepoint"
    base = {"job": catalog.job, "root": catalog.uri, "kind": kind}
    if source.run is not None:
        request = request_savepoint(catalog, source.run, stop=args.stop, timeout_s=args.timeout,
                                    requested_by=_requester())
        generation = source.run.generation
        if args.no_wait:
            if args.json:
                _emit_json({**base, "source": "running-job", "request_id": request.id, "state": "pending",
                            "generation": generation, "savepoint": None, "batch_id": None})
            else:
                print(request.id)
                print(f"submitted {kind} request {request.id} to generation {generation} of job "
                      f"{catalog.job!r}; it expires in {args.timeout:g} s", file=sys.stderr)
            return EXIT_OK
        if not args.json:
            print(f"waiting for generation {generation} of job {catalog.job!r} to take a "
                  f"{'savepoint and stop' if args.stop else 'savepoint'} (request {request.id}, "
                  f"timeout {args.timeout:g} s)", file=sys.stderr)
        try:
            result = wait_for_savepoint(catalog, request, timeout_s=args.timeout, poll_s=args.poll,
                                        max_heartbeat_age=args.max_heartbeat_age)
        except ControlError as exc:
            raise CommandFailed(str(exc)) from None
        try:  # housekeeping: forget requests that finished more than a day ago
            ControlChannel(catalog).cleanup()
        except StorageError as exc:
            log.warning("could not clean up old control requests: %s", exc)
        if args.json:
            _emit_json({**base, "source": "running-job", "request_id": request.id, "state": result.state,
                        "generation": result.generation, "savepoint": result.savepoint, "batch_id": result.batch_id})
        else:
            print(result.savepoint)
        return EXIT_OK

    def announce(line: str) -> None:
        print(line, file=sys.stderr)

    # Refused, or no completed checkpoint: a CatalogError, exit 1 like any SparkpointError.
    latest, handle = savepoint_from_latest_checkpoint(
        catalog, source, refused_by=None if args.from_checkpoint else "--no-from-checkpoint", stop=args.stop,
        announce=None if args.json else announce)
    if args.json:
        _emit_json({**base, "source": "checkpoint", "request_id": None, "state": "completed",
                    "generation": handle.metadata.generation, "savepoint": handle.uri,
                    "batch_id": handle.metadata.batch_id, "checkpoint_id": latest.id})
    else:
        print(handle.uri)
    return EXIT_OK


def _requester() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return f"sparkpoint-cli:{user}@{socket.gethostname()}:{os.getpid()}"


# --------------------------------------------------------------------------- dispose


def cmd_dispose(args: argparse.Namespace) -> int:
    by_policy = args.older_than is not None or args.keep is not None
    if by_policy == (args.path is not None):
        raise UsageError("give either PATH or --older-than/--keep (not both)" if by_policy else
                         "give PATH (a savepoint or checkpoint), or --older-than DURATION and/or --keep N")
    catalog = _open_catalog(args)
    if by_policy:
        return _dispose_savepoints(args, catalog)
    try:
        key = catalog.key_of(args.path)
        count = catalog.dispose(args.path)
    except RestoreError as exc:  # outside the job, or not a snapshot directory: bad input
        raise UsageError(str(exc)) from None
    uri = f"{catalog.uri}/{key}"
    if count == 0:
        raise CommandFailed(f"nothing to dispose at {uri}: no such checkpoint or savepoint (see `sparkpoint list`)")
    if args.json:
        _emit_json({"job": catalog.job, "root": catalog.uri, "disposed": uri, "objects": count})
    else:
        print(f"disposed {uri} ({count} objects)")
    return EXIT_OK


def _dispose_savepoints(args: argparse.Namespace, catalog: Any) -> int:
    from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention

    disposed = savepoint_history_retention(catalog, max_count=args.keep, max_age_s=args.older_than)
    entries = catalog.list_savepoints()
    kept = [entry.uri for entry in entries]
    if args.json:
        _emit_json({"job": catalog.job, "root": catalog.uri, "keep": args.keep, "older_than_s": args.older_than,
                    "disposed_savepoints": disposed, "kept_savepoints": kept})
    else:
        for uri in disposed:
            print(f"disposed {uri}")
        print(f"{len(disposed)} savepoint(s) disposed, {len(kept)} kept" + (":" if kept else ""))
        for entry, why in _why_kept(catalog, entries):
            print(f"kept {entry.uri} ({why})")
    return EXIT_OK


def _why_kept(catalog: Any, entries: list[Any]) -> list[tuple[Any, str]]:
    """Each savepoint retention left, newest first, with why (the rules of
    `retention.savepoint_history_retention`)."""
    from airflow_sparkpoint.checkpoints.retention import relied_on_savepoints

    relied_on = relied_on_savepoints(catalog)
    valid = sorted((e for e in entries if e.metadata is not None),
                   key=lambda e: (e.metadata.created_at, e.id), reverse=True)
    reasons = []
    for index, entry in enumerate(valid):
        if index == 0:
            why = "the newest"
        elif entry.key in relied_on:
            why = "the job's newest lineage starts from it: restore=latest may restart there"
        else:
            why = "within the limits"
        reasons.append((entry, why))
    for entry in entries:
        if entry.metadata is None:
            reasons.append((entry, "incomplete, untouched for less than an hour" if "no _metadata" in (entry.error or "")
                            else f"invalid, kept for inspection: {entry.error}"))
    return reasons


# --------------------------------------------------------------------------- requests


def cmd_requests_list(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.history import open_requests

    catalog = _open_catalog(args)
    records = open_requests(catalog)
    if args.json:
        _emit_json({"job": catalog.job, "root": catalog.uri, "requests": [r.to_json() for r in records]})
        return EXIT_OK
    if not records:
        print(f"no open control requests for job {catalog.job!r}")
        return EXIT_OK
    print(_table(["ID", "KIND", "STATE", "GENERATION", "CREATED", "EXPIRES", "BY"],
                 [[r.id, r.kind, r.state, r.generation, _iso(r.created_at), _iso(r.deadline), r.requested_by]
                  for r in records]))
    return EXIT_OK


def cmd_requests_withdraw(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.control import REQUEST_ID_RE, ControlChannel

    if not REQUEST_ID_RE.match(args.request_id):
        raise UsageError(f"request id {args.request_id!r} is malformed; expected '<13 digits>-<8 hex>' as printed "
                         "by `sparkpoint savepoint --no-wait` or `sparkpoint requests list`")
    catalog = _open_catalog(args)
    reason = args.reason or f"withdrawn by {_requester()}"
    try:
        result = ControlChannel(catalog).withdraw(args.request_id, reason)
    except ControlError as exc:
        raise CommandFailed(f"{exc} (see `sparkpoint requests list`)") from None
    withdrawn = result.state == "expired" and result.error == reason
    if args.json:
        _emit_json({"job": catalog.job, "root": catalog.uri, "request_id": args.request_id,
                    "withdrawn": withdrawn, "state": result.state, "generation": result.generation,
                    "error": result.error})
    elif withdrawn:
        print(f"withdrew request {args.request_id} of job {catalog.job!r}")
    if not withdrawn:
        why = (f"generation {result.generation} already took it; it runs to its end" if result.state == "acknowledged"
               else f"it already ended ({result.state}{': ' + result.error if result.error else ''})")
        raise CommandFailed(f"request {args.request_id} of job {catalog.job!r} was not withdrawn: {why}")
    return EXIT_OK


# --------------------------------------------------------------------------- commit, demo


def cmd_commit(args: argparse.Namespace) -> int:
    catalog = _open_catalog(args)
    declared = {} if args.sink is None else {
        "sink": _lazy("airflow_sparkpoint.sinks.resolve", "parse_sink_arg", "commit")(args.sink, args.sink_option)}
    if args.abort_generation is not None:
        abort = _lazy("airflow_sparkpoint.sinks.rollback", "abort_stopped_generation", "commit")
        # Refused while the generation runs: a GenerationRunning, exit 1 like any SparkpointError.
        aborted = abort(catalog, args.abort_generation, max_heartbeat_age=args.max_heartbeat_age,
                        how_to_stop="`sparkpoint savepoint --stop`", storage_options=_storage_options(args),
                        **declared)
        summary: dict[str, Any] = {"aborted": list(aborted)}
    else:
        commit_pending = _lazy("airflow_sparkpoint.sinks.commit", "commit_pending", "commit")
        extra = {} if args.upto_batch is None else {"upto_batch": args.upto_batch}
        result = commit_pending(catalog, storage_options=_storage_options(args), **declared, **extra)
        summary = dict(result) if isinstance(result, Mapping) else {"result": result}
    if args.json:
        _emit_json({"job": catalog.job, "root": catalog.uri, "result": summary})
    elif summary:
        print(_pairs([(str(k), _listing(v)) for k, v in summary.items()]))
    else:
        print(f"nothing to commit for job {catalog.job!r}")
    return EXIT_OK


def cmd_demo(args: argparse.Namespace) -> int:
    demo_main = _lazy("airflow_sparkpoint.demo", "main", "demo")
    try:
        code = demo_main(list(args.args))
    except SystemExit as exc:
        code = exc.code
    if code is None:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_FAILURE
