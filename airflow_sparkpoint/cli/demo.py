"""``sparkpoint demo``: the guided demo (everything after ``demo`` is its own arguments)."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_sparkpoint.cli.options import requires
from airflow_sparkpoint.cli.output import EXIT_FAILURE, EXIT_OK

__all__ = ["add_demo", "cmd_demo"]


def add_demo(commands: Any) -> None:
    """List ``demo`` for --help only: `main` hands everything after it to the demo unparsed."""
    commands.add_parser("demo", add_help=False, help="run the guided demo (sparkpoint demo --workdir DIR)")


def cmd_demo(args: argparse.Namespace) -> int:
    with requires("demo"):
        from airflow_sparkpoint.demo import main as demo_main
    code: Any
    try:
        code = demo_main(list(args.args))
    except SystemExit as exc:
        code = exc.code
    if code is None:
        return EXIT_OK
    return code if isinstance(code, int) else EXIT_FAILURE
