"""``sparkpoint requests list|withdraw``: the control requests (savepoint, stop) no run
has answered yet."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json, iso, table
from airflow_sparkpoint.exceptions import CommandFailed, ControlError, UsageError
from airflow_sparkpoint.services.control import REQUEST_ID_RE, open_requests, withdraw_request
from airflow_sparkpoint.services.savepoint import requester

__all__ = ["add_requests", "cmd_requests_list", "cmd_requests_withdraw"]


def add_requests(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``requests list`` and ``requests withdraw``."""
    p = commands.add_parser(
        "requests", help="control requests (savepoint, stop) nobody answered yet: list or withdraw",
        description="A request a running job has not taken yet can be withdrawn (it "
                    "expires, and no job takes it "
                    "later); one a job already acknowledged runs to its end.",
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    a = actions.add_parser("list", parents=[common], help="pending and acknowledged requests, oldest first")
    a.set_defaults(func=cmd_requests_list)
    a = actions.add_parser("withdraw", parents=[common],
                           help="withdraw a pending request (its id, as printed by "
                           "`sparkpoint savepoint --no-wait` or `sparkpoint requests list`)")
    a.add_argument("request_id", metavar="ID")
    a.add_argument("--reason", default=None,
                   help="recorded as the request's error (default: who withdrew it)")
    a.set_defaults(func=cmd_requests_withdraw)


def cmd_requests_list(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    records = open_requests(catalog)
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "requests": [r.to_json() for r in records]})
        return EXIT_OK
    if not records:
        print(f"no open control requests for job {catalog.job!r}")
        return EXIT_OK
    print(table(["ID", "KIND", "STATE", "GENERATION", "CREATED", "EXPIRES", "BY"],
                [[r.id, r.kind, r.state, r.generation, iso(r.created_at), iso(r.deadline), r.requested_by]
                 for r in records]))
    return EXIT_OK


def cmd_requests_withdraw(args: argparse.Namespace) -> int:
    if not REQUEST_ID_RE.match(args.request_id):
        raise UsageError(f"request id {args.request_id!r} is malformed; expected '<13 "
                         "digits>-<8 hex>' as printed "
                         "by `sparkpoint savepoint --no-wait` or `sparkpoint requests list`")
    catalog = open_catalog(args)
    reason = args.reason or f"withdrawn by {requester('sparkpoint-cli', pid=True)}"
    try:
        result = withdraw_request(catalog, args.request_id, reason)
    except ControlError as exc:
        raise CommandFailed(f"{exc} (see `sparkpoint requests list`)") from None
    withdrawn = result.state == "expired" and result.error == reason
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "request_id": args.request_id,
                   "withdrawn": withdrawn, "state": result.state, "generation": result.generation,
                   "error": result.error})
    elif withdrawn:
        print(f"withdrew request {args.request_id} of job {catalog.job!r}")
    if not withdrawn:
        why = (f"generation {result.generation} already took it; it runs to its end"
               if result.state == "acknowledged"
               else f"it already ended ({result.state}{': ' + result.error if result.error else ''})")
        raise CommandFailed(f"request {args.request_id} of job {catalog.job!r} was not withdrawn: {why}")
    return EXIT_OK
