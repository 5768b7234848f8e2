"""``sparkpoint dispose``: delete a savepoint or checkpoint, or old savepoints by age or
count (the newest, and the one the job's newest lineage started from, are kept)."""

from __future__ import annotations

import argparse
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog, positive_seconds, whole_number
from airflow_sparkpoint.cli.output import EXIT_OK, emit_json
from airflow_sparkpoint.exceptions import CommandFailed, RestoreError, UsageError

__all__ = ["add_dispose", "cmd_dispose"]


def add_dispose(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``dispose``."""
    p = commands.add_parser(
        "dispose", parents=[common], help="delete a savepoint (or checkpoint), or old savepoints by age or count",
        description="Delete PATH; or, with --older-than and/or --keep, the savepoints beyond those limits. The "
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
        return _dispose_savepoints(args, catalog)
    try:
        key = catalog.key_of(args.path)
        count = catalog.dispose(args.path)
    except RestoreError as exc:  # outside the job, or not a snapshot directory: bad input
        raise UsageError(str(exc)) from None
    uri = f"{catalog.uri}/{key}"
    if count == 0:
        raise CommandFailed(f"nothing to dispose at {uri}: no such checkpoint or savepoint (see `sparkpoint list`)")
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "disposed": uri, "objects": count})
    else:
        print(f"disposed {uri} ({count} objects)")
    return EXIT_OK


def _dispose_savepoints(args: argparse.Namespace, catalog: Any) -> int:
    from airflow_sparkpoint.checkpoints.retention import savepoint_history_retention

    disposed = savepoint_history_retention(catalog, max_count=args.keep, max_age_s=args.older_than)
    entries = catalog.list_savepoints()
    kept = [entry.uri for entry in entries]
    if args.json:
        emit_json({"job": catalog.job, "root": catalog.uri, "keep": args.keep, "older_than_s": args.older_than,
                   "disposed_savepoints": disposed, "kept_savepoints": kept})
    else:
        for uri in disposed:
            print(f"disposed {uri}")
        print(f"{len(disposed)} savepoint(s) disposed, {len(kept)} kept" + (":" if kept else ""))
        for entry, why in _why_kept(catalog, entries):
            print(f"kept {entry.uri} ({why})")
    return EXIT_OK


def _why_kept(catalog: Any, entries: list[Any]) -> list[tuple[Any, str]]:
    """Each savepoint retention left, newest first, with why (the rules of
    `retention.savepoint_history_retention`)."""
    from airflow_sparkpoint.checkpoints.retention import relied_on_savepoints

    relied_on = relied_on_savepoints(catalog)
    valid = sorted((e for e in entries if e.metadata is not None),
                   key=lambda e: (e.metadata.created_at, e.id), reverse=True)
    reasons = []
    for index, entry in enumerate(valid):
        if index == 0:
            why = "the newest"
        elif entry.key in relied_on:
            why = "the job's newest lineage starts from it: restore=latest may restart there"
        else:
            why = "within the limits"
        reasons.append((entry, why))
    for entry in entries:
        if entry.metadata is None:
            reasons.append((entry, "incomplete, untouched for less than an hour" if "no _metadata" in (entry.error or "")
                            else f"invalid, kept for inspection: {entry.error}"))
    return reasons
