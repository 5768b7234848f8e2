"""The ``sparkpoint`` command: look at and act on the checkpoints of one job.

::

    sparkpoint list      --dir URI --job NAME [--json]
    sparkpoint status    --dir URI --job NAME [--max-heartbeat-age S] [--json]
    sparkpoint savepoint --dir URI --job NAME [--stop] [--timeout S] [--no-wait] [--no-from-checkpoint]
    sparkpoint dispose   --dir URI --job NAME PATH | [--older-than DURATION] [--keep N]
    sparkpoint requests  list|withdraw ID  --dir URI --job NAME [--reason TEXT]
    sparkpoint commit    --dir URI --job NAME [--upto-batch N | --abort-generation G] [--sink KIND:URI]
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
import logging
import sys
from collections.abc import Sequence
from typing import Any

from airflow_sparkpoint import cli_state
from airflow_sparkpoint.cli_commands import (
    cmd_commit,
    cmd_demo,
    cmd_dispose,
    cmd_list,
    cmd_metrics,
    cmd_requests_list,
    cmd_requests_withdraw,
    cmd_savepoint,
    cmd_status,
)
from airflow_sparkpoint.cli_common import (  # re-exported: callers import them from here
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_USAGE,
    CommandFailed,
    UsageError,
    _batch_id,
    _common_options,
    _generation,
    _positive_seconds,
    _whole_number,
)
from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, SparkpointError
from airflow_sparkpoint.process_exit import exit_process

__all__ = ["EXIT_FAILURE", "EXIT_OK", "EXIT_USAGE", "CommandFailed", "UsageError", "_positive_seconds",
           "build_parser", "main"]


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

    p = commands.add_parser(
        "dispose", parents=[common], help="delete a savepoint (or checkpoint), or old savepoints by age or count",
        description="Delete PATH; or, with --older-than and/or --keep, the savepoints beyond those limits. The "
                    "newest savepoint and the one the job's newest lineage started from are always kept.",
    )
    p.add_argument("path", metavar="PATH", nargs="?", default=None,
                   help="its URI, path, or key (as shown by `sparkpoint list`)")
    p.add_argument("--older-than", type=_positive_seconds, default=None, metavar="DURATION",
                   help="dispose of savepoints older than this (seconds, or e.g. '7d', '30 days')")
    p.add_argument("--keep", type=_whole_number("number of savepoints", 1), default=None, metavar="N",
                   help="keep at most the N newest savepoints")
    p.set_defaults(func=cmd_dispose)

    p = commands.add_parser(
        "requests", help="control requests (savepoint, stop) nobody answered yet: list or withdraw",
        description="A request a running job has not taken yet can be withdrawn (it expires, and no job takes it "
                    "later); one a job already acknowledged runs to its end.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    a = actions.add_parser("list", parents=[common], help="pending and acknowledged requests, oldest first")
    a.set_defaults(func=cmd_requests_list)
    a = actions.add_parser("withdraw", parents=[common], help="withdraw a pending request (its id, as printed by "
                           "`sparkpoint savepoint --no-wait` or `sparkpoint requests list`)")
    a.add_argument("request_id", metavar="ID")
    a.add_argument("--reason", default=None, help="recorded as the request's error (default: who withdrew it)")
    a.set_defaults(func=cmd_requests_withdraw)

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
    p.add_argument("--sink", default=None, metavar="KIND:URI",
                   help="the job's sink (e.g. delta:s3://bucket/table): records for any other sink are refused; "
                        "without it each record's own sink config is used, confined to its root (a warning)")
    p.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a constructor argument of --sink (e.g. format=json, mode=merge, keys=id); repeatable")
    p.set_defaults(func=cmd_commit)

    p = commands.add_parser(
        "metrics", parents=[_common_options(many_jobs=True)],
        help="checkpoint health metrics in Prometheus text format (Flink's names)",
        description="Prints each job's checkpoint metrics (docs/CLI.md) in the Prometheus text exposition "
                    "format, for a scraper outside Airflow (e.g. a textfile collector).",
    )
    p.add_argument("--max-heartbeat-age", type=_positive_seconds, default=60.0, metavar="S", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_metrics)

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
    from airflow_sparkpoint.storage.redact import scrub

    print(f"sparkpoint {args.command}: error: {scrub(str(exc))}", file=sys.stderr)


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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
