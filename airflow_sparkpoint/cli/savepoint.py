"""``sparkpoint savepoint``: a savepoint of the live run, or of the latest completed
checkpoint (stop-with-savepoint with ``--stop``)."""

from __future__ import annotations

import argparse
import getpass
import logging
import os
import socket
import sys
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog, positive_seconds
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json
from airflow_sparkpoint.exceptions import CommandFailed, ControlError, StorageError

__all__ = ["add_savepoint", "cmd_savepoint", "requester"]

log = logging.getLogger("airflow_sparkpoint.cli")


def add_savepoint(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``savepoint``."""
    p = commands.add_parser(
        "savepoint", parents=[common], help="take a savepoint (of the running job, or from the latest checkpoint)",
        description="Ask the running job for a savepoint and wait for it. With no live job, make the savepoint "
                    "from the latest completed checkpoint (unless --no-from-checkpoint).",
    )
    p.add_argument("--stop", action="store_true", help="stop the job after the savepoint (stop-with-savepoint)")
    p.add_argument("--timeout", type=positive_seconds, default=600.0, metavar="S",
                   help="give up after this many seconds (default: 600)")
    p.add_argument("--no-wait", action="store_true", help="submit the request, print its id and return")
    p.add_argument("--from-checkpoint", action=argparse.BooleanOptionalAction, default=True,
                   help="with no live job, make the savepoint from the latest completed checkpoint (default: on)")
    p.add_argument("--max-heartbeat-age", type=positive_seconds, default=60.0, metavar="S",
                   help="a heartbeat older than this means the job is not alive (default: 60)")
    p.add_argument("--poll", type=positive_seconds, default=1.0, metavar="S", help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_savepoint)


def cmd_savepoint(args: argparse.Namespace) -> int:
    from airflow_sparkpoint.checkpoints.control import ControlChannel
    from airflow_sparkpoint.checkpoints.savepoints import (
        request_savepoint,
        savepoint_from_latest_checkpoint,
        savepoint_source,
        wait_for_savepoint,
    )

    catalog = open_catalog(args)
    source = savepoint_source(catalog, args.max_heartbeat_age)
    kind = "stop" if args.stop else "savepoint"
    base = {"job": catalog.job, "root": catalog.uri, "kind": kind}
    if source.run is not None:
        request = request_savepoint(catalog, source.run, stop=args.stop, timeout_s=args.timeout,
                                    requested_by=requester())
        generation = source.run.generation
        if args.no_wait:
            if args.json:
                emit_json({**base, "source": "running-job", "request_id": request.id, "state": "pending",
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
            emit_json({**base, "source": "running-job", "request_id": request.id, "state": result.state,
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
        emit_json({**base, "source": "checkpoint", "request_id": None, "state": "completed",
                   "generation": handle.metadata.generation, "savepoint": handle.uri,
                   "batch_id": handle.metadata.batch_id, "checkpoint_id": latest.id})
    else:
        print(handle.uri)
    return EXIT_OK


def requester() -> str:
    """Who files this command's control requests: ``sparkpoint-cli:<user>@<host>:<pid>``."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = "unknown"
    return f"sparkpoint-cli:{user}@{socket.gethostname()}:{os.getpid()}"
