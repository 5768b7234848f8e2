"""``sparkpoint savepoint``: a savepoint of the live run, or of the latest completed
checkpoint (stop-with-savepoint with ``--stop``; with ``--stop --after-batch N`` the run
stops after batch N instead: a zero-downtime cutover's stop, no savepoint)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog, positive_seconds
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json
from airflow_sparkpoint.exceptions import UsageError
from airflow_sparkpoint.services.control import ControlRequest
from airflow_sparkpoint.services.cutover import stop_after_batch
from airflow_sparkpoint.services.savepoint import requester, take_savepoint

__all__ = ["add_savepoint", "cmd_savepoint"]


def add_savepoint(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``savepoint``."""
    p = commands.add_parser(
        "savepoint", parents=[common], help="take a savepoint (of the running job, or "
                                            "from the latest checkpoint)",
        description="Ask the running job for a savepoint and wait for it. With no live "
                    "job, make the savepoint "
                    "from the latest completed checkpoint (unless --no-from-checkpoint).",
    )
    p.add_argument("--stop", action="store_true", help="stop the job after the savepoint "
                                                       "(stop-with-savepoint)")
    p.add_argument("--after-batch", type=int, default=None, metavar="N",
                   help="with --stop: stage and commit exactly through batch N, take the final "
                        "checkpoint there and stop (refused when the run is already past N; "
                        "no savepoint is copied: the result names the final checkpoint)")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                   help="give up after this many seconds (default: 600)")
    p.add_argument("--no-wait", action="store_true", help="submit the request, print its id and return")
    p.add_argument("--from-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="with no live job, make the savepoint from the latest completed "
                        "checkpoint (default: on)")
    p.add_argument("--max-heartbeat-age", type=positive_seconds, default=60.0, metavar="S",
                   help="a heartbeat older than this means the job is not alive (default: 60)")
    p.add_argument("--poll", type=positive_seconds, default=1.0, metavar="S", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_savepoint)


def cmd_savepoint(args: argparse.Namespace) -> int:
    if args.after_batch is not None:
        return _stop_after(args)
    catalog = open_catalog(args)
    kind = "stop" if args.stop else "savepoint"
    base = {"job": catalog.job, "root": catalog.uri, "kind": kind}

    def filed(request: ControlRequest) -> None:
        if not args.no_wait and not args.json:
            print(f"waiting for generation {request.generation} of job {catalog.job!r} to take a "
                  f"{'savepoint and stop' if args.stop else 'savepoint'} (request {request.id}, "
                  f"timeout {args.timeout:g} s)", file=sys.stderr)

    def announce(line: str) -> None:
        print(line, file=sys.stderr)

    # Refused, no completed checkpoint, failed or timed out: a SparkpointError, exit 1.
    done = take_savepoint(
        catalog, stop=args.stop, timeout_s=args.timeout, poll_s=args.poll,
        max_heartbeat_age=args.max_heartbeat_age, requested_by=requester("sparkpoint-cli", pid=True),
        refused_by=None if args.from_checkpoint else "--no-from-checkpoint", wait=not args.no_wait,
        on_request=filed, announce=None if args.json else announce)
    if done.state == "pending":
        if args.json:
            emit_json({**base, "source": done.source, "request_id": done.request_id, "state": done.state,
                       "generation": done.generation, "savepoint": None, "batch_id": None})
        else:
            print(done.request_id)
            print(f"submitted {kind} request {done.request_id} to generation {done.generation} of job "
                  f"{catalog.job!r}; it expires in {args.timeout:g} s", file=sys.stderr)
        return EXIT_OK
    if args.json:
        document = {**base, "source": done.source, "request_id": done.request_id, "state": done.state,
                    "generation": done.generation, "savepoint": done.uri, "batch_id": done.batch_id}
        if done.source == "checkpoint":
            document["checkpoint_id"] = done.checkpoint_id
        emit_json(document)
    else:
        print(done.uri)
    return EXIT_OK


def _stop_after(args: argparse.Namespace) -> int:
    """``savepoint --stop --after-batch N``: the live run stops after batch N."""
    if not args.stop:
        raise UsageError("--after-batch N needs --stop (the run stops after batch N)")
    if args.after_batch < 0:
        raise UsageError(f"--after-batch {args.after_batch} is invalid; expected a batch id >= 0")
    catalog = open_catalog(args)
    if not args.no_wait and not args.json:
        print(f"waiting for the live run of job {catalog.job!r} to stop after batch {args.after_batch} "
              f"(timeout {args.timeout:g} s)", file=sys.stderr)
    done = stop_after_batch(catalog, args.after_batch, timeout_s=args.timeout, poll_s=args.poll,
                            max_heartbeat_age=args.max_heartbeat_age,
                            requested_by=requester("sparkpoint-cli", pid=True), wait=not args.no_wait)
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "kind": "stop_after", "source": "running-job",
                   "request_id": done.request_id, "state": done.state, "generation": done.generation,
                   "savepoint": done.savepoint, "batch_id": done.batch_id, "after_batch": done.after_batch,
                   "checkpoint": done.checkpoint})
    elif done.state == "pending":
        print(done.request_id)
    else:
        print(done.checkpoint)
    return EXIT_OK
