"""``sparkpoint inspect`` and ``sparkpoint verify``: the state inside a snapshot.

::

    sparkpoint inspect --dir URI --job NAME PATH|latest [--rows [--operator ID] [--store NAME]
                       [--key JSON] [--limit N]] [--json]
    sparkpoint verify  --dir URI --job NAME PATH|latest [--json]

Both need PySpark (a local session is started); both read a private copy of the
snapshot and neither writes to a sink nor claims a generation. ``verify`` records its
outcome next to the snapshot. The JSON shapes are in ``docs/CLI.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import Any

from airflow_sparkpoint.cli.options import open_catalog, storage_options
from airflow_sparkpoint.cli.output import EXIT_FAILURE, EXIT_OK, emit_json, table
from airflow_sparkpoint.exceptions import CommandFailed, UsageError
from airflow_sparkpoint.services.state import StateRows, inspect_state, verify_state

__all__ = ["add_inspect", "add_verify", "cmd_inspect", "cmd_verify"]


def _limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of rows") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected a number of rows >= 1")
    return value


def _operator_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an operator id (see `sparkpoint "
                                         "inspect` without --rows)") \
            from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; expected an operator id >= 0")
    return value


def _count(n: Any, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def add_inspect(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``inspect``."""
    p = commands.add_parser(
        "inspect", parents=[common], help="the state inside a checkpoint or savepoint (needs PySpark)",
        description="Operators, state stores, schemas, partitions and row counts of a "
                    "snapshot, read with Spark's "
                    "state data sources over a private copy (the job and the snapshot are never touched).",
    )
    p.add_argument("target", metavar="PATH|latest",
                   help="a snapshot URI, path or key (as `sparkpoint list` shows), or latest "
                        "(what restore=latest uses)")
    p.add_argument("--rows", action="store_true", help="also print the rows of one state store")
    p.add_argument("--operator", type=_operator_id, default=None, metavar="ID",
                   help="with --rows: the operator (default: the first stateful operator)")
    p.add_argument("--store", default=None, metavar="NAME",
                   help="with --rows: the store or state variable (default: the operator's first)")
    p.add_argument("--key", default=None, metavar="JSON",
                   help='with --rows: only rows whose key has these field values, e.g. \'{"user": "u1"}\'')
    p.add_argument("--limit", type=_limit, default=20, metavar="N",
                   help="with --rows: at most N rows (default 20)")
    p.set_defaults(func=cmd_inspect)


def add_verify(commands: Any, common: argparse.ArgumentParser) -> None:
    """Register ``verify``."""
    p = commands.add_parser(
        "verify", parents=[common], help="restore drill without the application: files and every state store",
        description="Materialize the snapshot into a scratch location, check every "
                    "referenced file's size and "
                    "sha256, open every state store of every operator and partition "
                    "and read all of it. Exit 0 "
                    "only when all of it reads. The outcome is recorded next to the "
                    "snapshot. The application "
                    "itself does not run: the full drill, which runs it from the snapshot "
                    "under a scratch identity, "
                    "is the Airflow operator SparkpointDrillOperator.",
    )
    p.add_argument("target", metavar="PATH|latest",
                   help="a snapshot URI, path or key (as `sparkpoint list` shows), or latest "
                        "(what restore=latest uses)")
    p.set_defaults(func=cmd_verify)


def _needs_pyspark(command: str) -> None:
    if importlib.util.find_spec("pyspark") is None:
        raise CommandFailed(f"`sparkpoint {command}` reads state with Spark and needs "
                            "PySpark; install it with: "
                            "pip install pyspark")


def _snapshot_options(args: argparse.Namespace) -> dict[str, Any]:
    """S3 endpoint and region for a snapshot given by URI (local paths ignore them)."""
    return dict(storage_options(args))


def cmd_inspect(args: argparse.Namespace) -> int:
    key = None
    if args.key is not None:
        if not args.rows:
            raise UsageError("--key needs --rows")
        try:
            key = json.loads(args.key)
        except ValueError as exc:
            raise UsageError(f"--key {args.key!r} is not JSON ({exc}); expected an object "
                             "like '{\"user\": \"u1\"}'") \
                from None
        if not isinstance(key, dict) or not key:
            raise UsageError(f"--key {args.key!r} is not a JSON object of key fields; expected "
                             "e.g. '{\"user\": \"u1\"}'")
    if not args.rows and (args.operator is not None or args.store is not None):
        raise UsageError("--operator and --store select the rows to print: they need --rows")
    catalog = open_catalog(args)
    _needs_pyspark("inspect")
    asked = StateRows(args.operator, args.store, key, args.limit) if args.rows else None
    inspected = inspect_state(catalog, args.target, storage_options=_snapshot_options(args), rows=asked)
    state, document, rows = inspected.state, inspected.document, inspected.rows
    if args.json:
        emit_json(document)
        return EXIT_OK
    print(f"{state.kind} {state.uri}  (job {state.job}, batch {state.batch_id})")
    if not state.operators:
        print("no state: the query has no stateful operator")
    else:
        stores = []
        for operator in state.operators:
            for store in operator.stores:
                stores.append([operator.id, operator.name, operator.partitions, store.name,
                               store.type + (" ttl" if store.ttl else ""), store.rows, store.keys,
                               store.key_schema, store.value_schema])
        print(table(["OP", "OPERATOR", "PARTITIONS", "STORE", "TYPE", "ROWS", "KEYS", "KEY", "VALUE"], stores,
                    right=frozenset({0, 2, 5, 6})))
    if rows is not None:
        print(f"\nrows of operator {document['operator']} store {document['store']} (at most {args.limit}):")
        for row in rows:
            extra = f" [{json.dumps(row['map_key'])}]" if "map_key" in row else ""
            ttl = f"  (expires at {row['ttl_expiration_ms']} ms)" if "ttl_expiration_ms" in row else ""
            print(f"{json.dumps(row['key'])}{extra} -> {json.dumps(row['value'])}{ttl}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    catalog = open_catalog(args)
    _needs_pyspark("verify")
    verified = verify_state(catalog, args.target, storage_options=_snapshot_options(args))
    result, document, recorded = verified.result, verified.document, verified.unrecorded
    if args.json:
        emit_json(document)
    elif result.ok:
        counted = ", ".join(_count(result.checks.get(k), k[:-1])
                            for k in ("operators", "partitions", "stores", "rows"))
        print(f"verified {result.uri} (batch {result.batch_id}): "
              f"{_count(result.checks.get('files'), 'file')} "
              f"({result.checks.get('bytes')} bytes) match _metadata; {counted} read in "
              f"{result.duration_s:.1f} s")
    if not result.ok:
        print(f"sparkpoint verify: error: {result.error}", file=sys.stderr)
    if recorded:
        print(f"sparkpoint: WARNING: {recorded}", file=sys.stderr)
    return EXIT_OK if result.ok else EXIT_FAILURE
