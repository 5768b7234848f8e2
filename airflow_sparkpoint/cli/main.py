"""The parser of the ``sparkpoint`` command and its entry point `main` (the commands
are in the modules of their groups; the usage is in `airflow_sparkpoint.cli`)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from airflow_sparkpoint.cli.commit import add_commit
from airflow_sparkpoint.cli.control import add_requests
from airflow_sparkpoint.cli.cutover import add_cutover
from airflow_sparkpoint.cli.demo import add_demo, cmd_demo
from airflow_sparkpoint.cli.dispose import add_dispose
from airflow_sparkpoint.cli.history import add_list, add_metrics, add_status
from airflow_sparkpoint.cli.options import common_options
from airflow_sparkpoint.cli.output import EXIT_FAILURE, EXIT_USAGE
from airflow_sparkpoint.cli.savepoint import add_savepoint
from airflow_sparkpoint.cli.state import add_inspect, add_verify
from airflow_sparkpoint.exceptions import ConfigError, InvalidPath, SparkpointError, UsageError
from airflow_sparkpoint.process_exit import exit_process

__all__ = ["build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (defaults are read from the environment when it is built)."""
    common = common_options()
    parser = argparse.ArgumentParser(
        prog="sparkpoint",
        description="Checkpoints, savepoints and exactly-once output for PySpark jobs.",
        epilog="Exit codes: 0 ok, 1 operational failure, 2 bad input. JSON shapes: docs/CLI.md",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    # in the order `sparkpoint --help` lists them
    add_list(commands, common)
    add_status(commands, common)
    add_savepoint(commands, common)
    add_dispose(commands, common)
    add_requests(commands, common)
    add_cutover(commands, common)
    add_commit(commands, common)
    add_metrics(commands)
    add_inspect(commands, common)
    add_verify(commands, common)
    add_demo(commands)
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
            args = argparse.Namespace(command="demo", func=cmd_demo, args=arguments[1:], json=False,
                                      verbose=0)
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
    from airflow_sparkpoint.services.stores import scrub

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

