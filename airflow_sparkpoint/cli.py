"""The ``sparkpoint`` command: look at and act on the checkpoints of one job.

::

    sparkpoint list      --dir URI --job NAME [--json]
    sparkpoint status    --dir URI --job NAME [--max-heartbeat-age S] [--json]
    sparkpoint savepoint --dir URI --job NAME [--stop] [--timeout S] [--no-wait] [--no-from-checkpoint]
    sparkpoint dispose   --dir URI --job NAME PATH
    sparkpoint commit    --dir URI --job NAME [--upto-batch N | --abort-generation G]
    sparkpoint inspect   --dir URI --job NAME PATH|latest [--rows [--operator ID] [--store NAME] [--key JSON]]
    sparkpoint verify    --dir URI --job NAME PATH|latest
    sparkpoint metrics   --dir URI --job NAME [--job NAME ...]
    sparkpoint demo      --workdir DIR

``--dir`` and ``--job`` default to ``$SPARKPOINT_DIR`` and ``$SPARKPOINT_JOB``;
``--s3-endpoint`` / ``--s3-region`` to ``$SPARKPOINT_S3_ENDPOINT`` / ``$SPARKPOINT_S3_REGION``.
S3 credentials come only from the standard AWS environment and config files.

Exit codes: 0 success, 1 operational failure (the store is unreachable, a savepoint
failed or timed out), 2 bad input (a missing or malformed value; the message names it).
The ``--json`` shapes are documented in ``docs/CLI.md`` and are stable.
"""

from __future__ import annotations

import argparse
import getpass
import importlib
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from airflow_sparkpoint.exceptions import (
    ConfigError,
    ControlError,
    InvalidPath,
    RestoreError,
    SparkpointError,
    StorageError,
)
from airflow_sparkpoint.process_exit import exit_process

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2

log = logging.getLogger("airflow_sparkpoint.cli")


class UsageError(SparkpointError):
    """Bad command-line input (exit code 2)."""


class CommandFailed(SparkpointError):
    """An operational failure already explained to the user (exit code 1)."""


# --------------------------------------------------------------------------- parser


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def _positive_seconds(text: str) -> float:
    from airflow_sparkpoint.runtime.config import parse_duration

    try:  # seconds, or a duration as Spark writes them ("5 minutes", "30s")
        value = parse_duration("", text)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds nor a duration like '5 minutes'") \
            from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a number of seconds > 0")
    return value


def _whole_number(what: str, minimum: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum`, errors naming the value and `what`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a {what} >= {minimum}")
        return value

    return parse


_batch_id = _whole_number("batch id", 0)
_generation = _whole_number("generation", 1)


def _common_options(*, many_jobs: bool = False) -> argparse.ArgumentParser:
    """The options every command takes; with `many_jobs`, ``--job`` may be repeated."""
    common = argparse.ArgumentParser(add_help=False)
    where = common.add_argument_group("where the job lives")
    where.add_argument("--dir", default=_env("SPARKPOINT_DIR"), metavar="URI",
                       help="storage root: a path, file:///path or s3://bucket/prefix (default: $SPARKPOINT_DIR)")
    if many_jobs:
        where.add_argument("--job", dest="jobs", action="append", default=None, metavar="NAME",
                           help="pipeline name; repeat for several (default: $SPARKPOINT_JOB)")
    else:
        where.add_argument("--job", default=_env("SPARKPOINT_JOB"), metavar="NAME",
                           help="pipeline name (default: $SPARKPOINT_JOB)")
    where.add_argument("--s3-endpoint", default=_env("SPARKPOINT_S3_ENDPOINT"), metavar="URL",
                       help="S3-compatible endpoint, e.g. http://minio:9000 (default: $SPARKPOINT_S3_ENDPOINT); "
                            "credentials come from the standard AWS environment/config")
    where.add_argument("--s3-region", default=_env("SPARKPOINT_S3_REGION"), metavar="REGION",
                       help="S3 region (default: $SPARKPOINT_S3_REGION, then the AWS default)")
    output = common.add_argument_group("output")
    output.add_argument("--json", action="store_true", help="print one JSON document (shapes: docs/CLI.md)")
    output.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    return common


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults are read from the environment when it is built)."""
    common = _common_options()
    parser = argparse.ArgumentParser(
        prog="sparkpoint",
        description="Checkpoints, savepoints and exactly-once output for PySpark jobs.",
        epilog="Exit codes: 0 ok, 1 operational failure, 2 bad input. JSON shapes: docs/CLI.md",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    p = commands.add_parser("list", parents=[common], help="checkpoints and savepoints, newest first")
    p.set_defaults(func=cmd_list)

    p = commands.add_parser("status", parents=[common], help="generation, liveness and last checkpoint")
    p.add_argument("--max-heartbeat-age", type=_positive_seconds, default=60.0, metavar="S",
                   help="a heartbeat older than this means the job is not alive (default: 60)")
    p.set_defaults(func=cmd_status)

    p = commands.add_parser(
        "savepoint", parents=[common], help="take a savepoint (of the running job, or from the latest checkpoint)",
        description="Ask the running job for a savepoint and wait for it. With no live job, make the savepoint "
                    "from the latest completed checkpoint (unless --no-from-checkpoint).",
    )
    p.add_argument("--stop", action="store_true", help="stop the job after the savepoint (stop-with-savepoint)")
    p.add_argument("--timeout", type=_positive_seconds, default=600.0, metavar="S",
                   help="give up after this many seconds (default: 600)")
    p.add_argument("--no-wait", action="store_true", help="submit the request, print its id and return")
    p.add_argument("--from-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="with no live job, make the savepoint from the latest completed checkpoint (default: on)")
    p.add_argument("--max-heartbeat-age", type=_positive_seconds, default=60.0, metavar="S",
                   help="a heartbeat older than this means the job is not alive (default: 60)")
    p.add_argument("--poll", type=_positive_seconds, default=1.0, metavar="S", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_savepoint)

    p = commands.add_parser("dispose", parents=[common], help="delete a savepoint (or checkpoint) of the job")
    p.add_argument("path", metavar="PATH", help="its URI, path, or key (as shown by `sparkpoint list`)")
    p.set_defaults(func=cmd_dispose)

    p = commands.add_parser("commit", parents=[common],
                            help="promote staged output of confirmed checkpoints (the two-phase-commit step)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--upto-batch", type=_batch_id, default=None, metavar="N",
                       help="commit confirmed batches only up to N (write-audit-publish: the audited range)")
    scope.add_argument("--abort-generation", type=_generation, default=None, metavar="G",
                       help="instead of committing, abort everything generation G staged (blue-green rollback); "
                            "refused while G is running")
    p.add_argument("--max-heartbeat-age", type=_positive_seconds, default=60.0, metavar="S",
                   help="with --abort-generation: a run with a younger heartbeat is still running (default 60)")
    p.set_defaults(func=cmd_commit)

    p = commands.add_parser(
        "metrics", parents=[_common_options(many_jobs=True)],
        help="checkpoint health metrics in Prometheus text format (Flink's names)",
        description="Prints each job's checkpoint metrics (docs/CLI.md) in the Prometheus text exposition "
                    "format, for a scraper outside Airflow (e.g. a textfile collector).",
    )
    p.add_argument("--max-heartbeat-age", type=_positive_seconds, default=60.0, metavar="S", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_metrics)

    from airflow_sparkpoint import cli_state  # inspect, verify: the state inside snapshots

    cli_state.add_commands(commands, common)

    # Listed for --help only: `main` hands everything after `demo` to the demo unparsed.
    commands.add_parser("demo", add_help=False, help="run the guided demo (sparkpoint demo --workdir DIR)")
    return parser


# --------------------------------------------------------------------------- entry point


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command given by `argv` and return its exit code; with `argv` None (the
    ``sparkpoint`` command itself) end the process with it instead.

    The command's process is ours: it ends without interpreter teardown once its output
    is flushed, because a native library's teardown can abort a command that succeeded
    (`airflow_sparkpoint.process_exit`).
    """
    code = _run(sys.argv[1:] if argv is None else argv)
    if argv is None:  # an unexpected exception skips this: it fails with or without teardown
        exit_process(code)
    return code


def _run(argv: Sequence[str]) -> int:
    arguments = list(argv)
    parser = build_parser()
    try:
        if arguments[:1] == ["demo"]:  # everything after `demo` belongs to the demo's own parser
            args = argparse.Namespace(command="demo", func=cmd_demo, args=arguments[1:], json=False, verbose=0)
        else:
            args = parser.parse_args(arguments)
    except SystemExit as exc:  # --help, or argparse's own usage errors (exit 2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    _configure_logging(args.verbose)
    try:
        code: int = args.func(args)
        return code
    except (UsageError, ConfigError, InvalidPath) as exc:
        _error(args, exc)
        return EXIT_USAGE
    except SparkpointError as exc:
        _error(args, exc)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print("sparkpoint: interrupted", file=sys.stderr)
        return 130


def _error(args: argparse.Namespace, exc: BaseException) -> None:
    print(f"sparkpoint {args.command}: error: {exc}", file=sys.stderr)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever `sys.stderr` is at the time of the record."""

    def __init__(self) -> None:
        super().__init__()

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


def _configure_logging(verbosity: int) -> None:
    """Only the CLI configures logging: warnings (or more with -v) of the package to stderr."""
    logger = logging.getLogger("airflow_sparkpoint")
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("sparkpoint: %(levelname)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbosity >= 2 else logging.INFO if verbosity == 1 else logging.WARNING)


# --------------------------------------------------------------------------- helpers


def _storage_options(args: argparse.Namespace) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if args.s3_endpoint:
        options["endpoint_url"] = args.s3_endpoint
    if args.s3_region:
        options["region_name"] = args.s3_region
    return options


def _open_catalog(args: argparse.Namespace) -> Any:
    """The job's catalog; fails fast on a missing root, bucket or unreachable endpoint."""
    from airflow_sparkpoint.checkpoints.catalog import Catalog
    from airflow_sparkpoint.checkpoints.layout import validate_job_name
    from airflow_sparkpoint.storage import LocalStorage, open_storage, split_uri

    if not args.dir:
        raise UsageError("--dir is required (or set SPARKPOINT_DIR)")
    if not args.job:
        raise UsageError("--job is required (or set SPARKPOINT_JOB)")
    validate_job_name(args.job)
    scheme = split_uri(args.dir)[0]
    options = _storage_options(args) if scheme == "s3" else {}  # S3 options mean nothing to other roots
    storage = open_storage(args.dir, **options)
    if isinstance(storage, LocalStorage) and not os.path.isdir(storage.root):
        raise CommandFailed(f"storage root {args.dir!r} does not exist ({storage.root}); check --dir")
    check = getattr(storage, "check", None)
    if callable(check):
        check()
    return Catalog(storage, args.job)


def _iso(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def _table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: frozenset[int] = frozenset()) -> str:
    """Left-aligned text columns, right-aligned number columns (indices in `right`)."""
    cells = [[("-" if v is None else str(v)) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[i]) if i in right else v.ljust(widths[i]) for i, v in enumerate(values)]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(r) for r in cells)])


def _pairs(pairs: Sequence[tuple[str, Any]]) -> str:
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {'-' if v is None else v}" for k, v in pairs)


def _listing(value: Any) -> Any:
    """Lists as ``2: a, b`` (``0`` when empty); anything else unchanged."""
    if isinstance(value, (list, tuple)):
        return f"{len(value)}: {', '.join(map(str, value))}" if value else "0"
    return value


def _emit_json(document: Mapping[str, Any]) -> None:
    print(json.dumps(document, indent=2, sort_keys=True, default=str))


def _other_jobs_hint(catalog: Any) -> str:
    try:
        names = [n for n in catalog.storage.list_dirs("") if n != catalog.job]
    except StorageError:
        return ""
    return f" (jobs under this root: {', '.join(names[:10])})" if names else ""


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


def _job_status(catalog: Any) -> Any:
    from airflow_sparkpoint.checkpoints.history import read_job_status

    return read_job_status(catalog)


def _liveness(status: Any, current_generation: int, max_age: float) -> tuple[bool, float | None]:
    from airflow_sparkpoint.checkpoints.history import liveness

    return liveness(status, current_generation, max_age)


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
    from airflow_sparkpoint.checkpoints.health import metric_values, prometheus_text
    from airflow_sparkpoint.checkpoints.history import load_history

    jobs = list(dict.fromkeys(args.jobs or ([_env("SPARKPOINT_JOB")] if _env("SPARKPOINT_JOB") else [])))
    if not jobs:
        raise UsageError("--job is required (or set SPARKPOINT_JOB); repeat --job for several jobs")
    histories = []
    for job in jobs:
        catalog = _open_catalog(argparse.Namespace(**{**vars(args), "job": job}))
        histories.append(load_history(catalog, max_heartbeat_age=args.max_heartbeat_age))
    if args.json:  # the same figures as a JSON document
        _emit_json({"jobs": [{"job": h.job, "root": h.root, "metrics": metric_values(h)} for h in histories]})
    else:
        sys.stdout.write(prometheus_text(({"job": h.job}, h) for h in histories))
    return EXIT_OK


# --------------------------------------------------------------------------- savepoint


def cmd_savepoint(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.control import ControlChannel

    catalog = _open_catalog(args)
    generation = catalog.current_generation()
    status = _job_status(catalog)
    alive, age = _liveness(status, generation, args.max_heartbeat_age)
    kind = "stop" if args.stop else "savepoint"
    base = {"job": catalog.job, "root": catalog.uri, "kind": kind}
    if alive:
        channel = ControlChannel(catalog)
        request = channel.submit(kind, timeout_s=args.timeout, generation=status.generation,
                                 requested_by=_requester())
        if args.no_wait:
            if args.json:
                _emit_json({**base, "source": "running-job", "request_id": request.id, "state": "pending",
                            "generation": status.generation, "savepoint": None, "batch_id": None})
            else:
                print(request.id)
                print(f"submitted {kind} request {request.id} to generation {status.generation} of job "
                      f"{catalog.job!r}; it expires in {args.timeout:g} s", file=sys.stderr)
            return EXIT_OK
        if not args.json:
            print(f"waiting for generation {status.generation} of job {catalog.job!r} to take a "
                  f"{'savepoint and stop' if args.stop else 'savepoint'} (request {request.id}, "
                  f"timeout {args.timeout:g} s)", file=sys.stderr)
        target = status.generation

        def is_alive() -> bool:
            current = _job_status(catalog)
            return current is not None and current.generation == target and current.is_alive(args.max_heartbeat_age)

        try:
            result = channel.wait(request.id, timeout_s=args.timeout, poll_s=args.poll, is_alive=is_alive)
        except ControlError as exc:
            raise CommandFailed(str(exc)) from None
        try:  # housekeeping: forget requests that finished more than a day ago
            channel.cleanup()
        except StorageError as exc:
            log.warning("could not clean up old control requests: %s", exc)
        if args.json:
            _emit_json({**base, "source": "running-job", "request_id": request.id, "state": result.state,
                        "generation": result.generation, "savepoint": result.savepoint, "batch_id": result.batch_id})
        else:
            print(result.savepoint)
        return EXIT_OK

    why = "has no live run (no status record)" if status is None else (
        f"has no live run (last state {status.state}, generation {status.generation}, heartbeat {age:.0f} s old)"
    )
    if not args.from_checkpoint:
        raise CommandFailed(
            f"job {catalog.job!r} {why}; no running job to take a savepoint, and --no-from-checkpoint refuses "
            "to make one from the latest completed checkpoint"
        )
    latest = catalog.latest()
    if latest is None:
        raise CommandFailed(
            f"job {catalog.job!r} {why} and has no completed checkpoint under {catalog.uri}; nothing to savepoint "
            "(see `sparkpoint list`)"
        )
    if not args.json:
        note = "; nothing to stop" if args.stop else ""
        print(f"job {catalog.job!r} {why}{note}; making a savepoint from its latest completed checkpoint "
              f"chk-{latest.id} (batch {latest.batch_id})", file=sys.stderr)
    handle = catalog.create_savepoint(catalog.handle(latest))
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
    catalog = _open_catalog(args)
    try:
        key = catalog._key_of(args.path)
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


# --------------------------------------------------------------------------- commit, demo


def _lazy(module: str, name: str, command: str) -> Callable[..., Any]:
    """Import `module.name` on first use, with a clear message when it is missing."""
    try:
        loaded = importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if missing == module or module.startswith(missing + ".") or missing.startswith("airflow_sparkpoint"):
            raise CommandFailed(
                f"`sparkpoint {command}` is not available in this installation: module {missing or module} is "
                "missing (upgrade airflow-sparkpoint)"
            ) from None
        top = missing.split(".", 1)[0]
        raise CommandFailed(f"`sparkpoint {command}` needs the Python package {top!r}, which is not "
                            f"installed ({exc}); install it with: pip install {top}") from None
    function = getattr(loaded, name, None)
    if not callable(function):
        raise CommandFailed(f"`sparkpoint {command}` is not available in this installation: {module} has no "
                            f"{name}() (upgrade airflow-sparkpoint)")
    return function  # type: ignore[no-any-return]


def cmd_commit(args: argparse.Namespace) -> int:
    catalog = _open_catalog(args)
    if args.abort_generation is not None:
        generation = args.abort_generation
        status = _job_status(catalog)
        alive, _age = _liveness(status, catalog.current_generation(), args.max_heartbeat_age)
        if alive and status is not None and int(status.generation) == generation:
            raise CommandFailed(
                f"generation {generation} of job {catalog.job!r} is still running (heartbeat younger than "
                f"{args.max_heartbeat_age:g} s); stop it first (`sparkpoint savepoint --stop`) before aborting "
                "its output"
            )
        abort = _lazy("airflow_sparkpoint.sinks.commit", "abort_generation", "commit")
        summary: dict[str, Any] = {"aborted": list(abort(catalog, generation,
                                                         storage_options=_storage_options(args)))}
    else:
        commit_pending = _lazy("airflow_sparkpoint.sinks.commit", "commit_pending", "commit")
        extra = {} if args.upto_batch is None else {"upto_batch": args.upto_batch}
        result = commit_pending(catalog, storage_options=_storage_options(args), **extra)
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
