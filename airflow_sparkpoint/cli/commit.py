"""``sparkpoint commit``: the two-phase-commit step (promote the staged output of
confirmed checkpoints), or, with ``--abort-generation``, a generation's rollback."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.cli.options import batch_id as batch_id_type
from airflow_sparkpoint.cli.options import (
    generation,
    open_catalog,
    positive_seconds,
    requires,
    storage_options,
)
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json, listing, pairs

__all__ = ["add_commit", "cmd_commit"]


def add_commit(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``commit``."""
    p = commands.add_parser("commit", parents=[common],
                            help="promote staged output of confirmed checkpoints (the two-phase-commit step)")
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("--upto-batch", type=batch_id_type, default=None, metavar="N",
                       help="commit confirmed batches only up to N (write-audit-publish: the audited range)")
    scope.add_argument("--abort-generation", type=generation, default=None, metavar="G",
                       help="instead of committing, abort everything generation G "
                            "staged (blue-green rollback); "
                            "refused while G is running")
    p.add_argument("--max-heartbeat-age", type=positive_seconds, default=60.0, metavar="S",
                   help="with --abort-generation: a run with a younger heartbeat is "
                        "still running (default 60)")
    p.add_argument("--sink", default=None, metavar="KIND:URI",
                   help="the job's sink (e.g. delta:s3://bucket/table): records for any "
                        "other sink are refused; "
                        "without it each record's own sink config is used, confined to its root (a warning)")
    p.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a constructor argument of --sink (e.g. format=json, "
                        "mode=merge, keys=id); repeatable")
    p.set_defaults(func=cmd_commit)


def cmd_commit(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    declared: dict[str, Any] = {}
    if args.sink is not None:
        with requires("commit"):
            from airflow_sparkpoint.services.sinks import parse_sink_arg
        declared["sink"] = parse_sink_arg(args.sink, args.sink_option)
    if args.abort_generation is not None:
        with requires("commit"):
            from airflow_sparkpoint.services.rollback import abort_stopped_generation
        # Refused while the generation runs: a GenerationRunning, exit 1 like any SparkpointError.
        aborted = abort_stopped_generation(
            catalog, args.abort_generation, max_heartbeat_age=args.max_heartbeat_age,
            how_to_stop="`sparkpoint savepoint --stop`", storage_options=storage_options(args), **declared)
        summary: dict[str, Any] = {"aborted": list(aborted)}
    else:
        with requires("commit"):
            from airflow_sparkpoint.services.commit import commit_pending
        extra = {} if args.upto_batch is None else {"upto_batch": args.upto_batch}
        result = commit_pending(catalog, storage_options=storage_options(args), **declared, **extra)
        summary = dict(result) if isinstance(result, Mapping) else {"result": result}
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "result": summary})
    elif summary:
        print(pairs([(str(k), listing(v)) for k, v in summary.items()]))
    else:
        print(f"nothing to commit for job {catalog.job!r}")
    return EXIT_OK
