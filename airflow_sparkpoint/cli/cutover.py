"""``sparkpoint cutover list|call-off``: the zero-downtime cutovers of a job."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json, iso, table
from airflow_sparkpoint.services.cutover import call_off, cutovers
from airflow_sparkpoint.services.savepoint import requester

__all__ = ["add_cutover", "cmd_cutover_call_off", "cmd_cutover_list"]


def add_cutover(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``cutover list`` and ``cutover call-off``."""
    p = commands.add_parser(
        "cutover", help="zero-downtime cutovers of a job: list, or call one off",
        description="While a cutover is open (planned, not done) no start of the job but its "
                    "green's is allowed; calling it off ends it as aborted.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    a = actions.add_parser("list", parents=[common], help="every cutover of the job, oldest first")
    a.set_defaults(func=cmd_cutover_list)
    a = actions.add_parser("call-off", parents=[common], help="end an open cutover as aborted")
    a.add_argument("cutover_id", metavar="ID")
    a.add_argument("--reason", default=None, help="recorded in its end (default: who called it off)")
    a.set_defaults(func=cmd_cutover_call_off)


def cmd_cutover_list(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    found = cutovers(catalog)
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "cutovers": [c.to_json() for c in found]})
        return EXIT_OK
    if not found:
        print(f"no cutovers of job {catalog.job!r}")
        return EXIT_OK
    print(table(["ID", "STEP", "BLUE", "AFTER BATCH", "GREEN", "CREATED", "BLUE'S SAVEPOINT"],
                [[c.id, c.step, c.plan.blue_generation, c.agreed.after_batch if c.agreed else "",
                  c.taken.generation if c.taken else "", iso(c.plan.created_at),
                  (c.taken.savepoint or "") if c.taken else ""] for c in found]))
    return EXIT_OK


def cmd_cutover_call_off(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    by = requester("sparkpoint-cli", pid=True)
    end = call_off(catalog, args.cutover_id, reason=args.reason or f"called off by {by}", by=by)
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "id": end.id, "outcome": end.outcome,
                   "step": end.step, "reason": end.reason})
    else:
        print(f"cutover {end.id} of job {catalog.job!r}: {end.outcome} at {end.step} ({end.reason})")
    return EXIT_OK
