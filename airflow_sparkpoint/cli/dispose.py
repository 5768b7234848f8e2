"""``sparkpoint dispose``: delete a savepoint or checkpoint, or old savepoints by age or
count (the newest, and the one the job's newest lineage started from, are kept)."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog, positive_seconds, whole_number
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json
from airflow_sparkpoint.exceptions import RestoreError, UsageError
from airflow_sparkpoint.services.dispose import dispose_savepoints, dispose_snapshot

__all__ = ["add_dispose", "cmd_dispose"]


def add_dispose(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``dispose``."""
    p = commands.add_parser(
        "dispose", parents=[common], help="delete a savepoint (or checkpoint), or old "
                                          "savepoints by age or count",
        description="Delete PATH; or, with --older-than and/or --keep, the savepoints "
                    "beyond those limits. The "
                    "newest savepoint and the one the job's newest lineage started from are always kept.",
    )
    p.add_argument("path", metavar="PATH", nargs="?", default=None,
                   help="its URI, path, or key (as shown by `sparkpoint list`)")
    p.add_argument("--older-than", type=positive_seconds, default=None, metavar="DURATION",
                   help="dispose of savepoints older than this (seconds, or e.g. '7d', '30 days')")
    p.add_argument("--keep", type=whole_number("number of savepoints", 1), default=None, metavar="N",
                   help="keep at most the N newest savepoints")
    p.set_defaults(func=cmd_dispose)


def cmd_dispose(args: argparse.Namespace) -> int:
    by_policy = args.older_than is not None or args.keep is not None
    if by_policy == (args.path is not None):
        raise UsageError("give either PATH or --older-than/--keep (not both)" if by_policy else
                         "give PATH (a savepoint or checkpoint), or --older-than DURATION and/or --keep N")
    catalog = open_catalog(args)
    if by_policy:
        done = dispose_savepoints(catalog, keep=args.keep, older_than_s=args.older_than)
        if args.json:
            emit_json({"job": catalog.job, "root": catalog.uri, "keep": args.keep,
                       "older_than_s": args.older_than,
                       "disposed_savepoints": done.disposed, "kept_savepoints": done.kept})
        else:
            for uri in done.disposed:
                print(f"disposed {uri}")
            print(f"{len(done.disposed)} savepoint(s) disposed, {len(done.kept)} kept"
                  + (":" if done.kept else ""))
            for uri, why in done.reasons:
                print(f"kept {uri} ({why})")
        return EXIT_OK
    try:  # nothing there: a CatalogError, exit 1 like any SparkpointError
        uri, count = dispose_snapshot(catalog, args.path)
    except RestoreError as exc:  # outside the job, or not a snapshot directory: bad input
        raise UsageError(str(exc)) from None
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "disposed": uri, "objects": count})
    else:
        print(f"disposed {uri} ({count} objects)")
    return EXIT_OK
