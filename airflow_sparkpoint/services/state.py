"""The state inside a snapshot, as use cases (``sparkpoint inspect``, ``sparkpoint
verify``): read it with Spark's state data sources over a private copy (`inspect_state`),
or restore it without the application and read every state store back, recording the
outcome next to the snapshot (`verify_state`). Neither writes to a sink nor claims a
generation. Both start a local Spark session (PySpark needed, imported when called).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.exceptions import (
    CommandFailed,
    ConfigError,
    SparkpointError,
    StorageError,
    UsageError,
)

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.runtime.state_inspect import SnapshotState
    from airflow_sparkpoint.runtime.verify import VerifyResult

__all__ = ["InspectedState", "StateRows", "VerifiedState", "inspect_state", "verify_state"]


@dataclass(frozen=True)
class StateRows:
    """Which rows of a state store to read: `operator` and `store` (None: the first
    stateful operator and its first store), `key` (field values a key must have), at
    most `limit`."""

    operator: int | None = None
    store: str | None = None
    key: Mapping[str, Any] | None = None
    limit: int = 20


@dataclass(frozen=True)
class InspectedState:
    """What `inspect_state` read: the snapshot's `state` and the JSON `document`
    (``docs/CLI.md``: ``sparkpoint inspect --json``), with ``operator``, ``store`` and
    ``rows`` when rows were asked for (`rows`)."""

    state: SnapshotState
    document: dict[str, Any]
    rows: list[dict[str, Any]] | None


def inspect_state(catalog: Catalog, target: str, *, storage_options: Mapping[str, Any],
                  rows: StateRows | None = None) -> InspectedState:
    """The operators, state stores, schemas, partitions and row counts of snapshot
    `target` (a URI, path or key, or ``latest``) of `catalog`'s job, and the rows `rows`
    asks for.

    :raises UsageError: an unknown operator, store or key field.
    :raises CommandFailed: Spark could not read the state (its first line, not a stack trace).
    :raises SparkpointError: the snapshot cannot be resolved or opened.
    """
    from airflow_sparkpoint.runtime.state_inspect import first_line, local_session, open_state, rows_as_json

    spark = local_session("sparkpoint-inspect")
    with open_state(spark, target, catalog=catalog, storage_options=dict(storage_options)) as snap:
        try:
            state = snap.state()
            body = {k: v for k, v in state.to_json().items() if k != "job"}
            document: dict[str, Any] = {"job": catalog.job, "root": catalog.uri, **body,
                                        "snapshot_job": state.job}
            found: list[dict[str, Any]] | None = None
            if rows is not None:
                op, spec = snap.store_spec(rows.operator, rows.store)
                key = dict(rows.key) if rows.key else None
                found = rows_as_json(snap.rows(op.id, spec.name, key), rows.limit)
                document.update({"operator": op.id, "store": spec.name, "rows": found})
        except ConfigError as exc:  # an unknown operator, store or key field
            raise UsageError(str(exc)) from None
        except SparkpointError:
            raise
        except Exception as exc:  # Spark's own errors: one line, not a JVM stack trace
            raise CommandFailed(f"cannot read the state of {snap.handle.uri}: {first_line(exc)} "
                                "(`sparkpoint verify` checks its files)") from exc
    return InspectedState(state, document, found)


@dataclass(frozen=True)
class VerifiedState:
    """What `verify_state` found (`result`), the JSON `document` (``sparkpoint verify
    --json``) and, when the outcome could not be recorded next to the snapshot, why
    (`unrecorded`)."""

    result: VerifyResult
    document: dict[str, Any]
    unrecorded: str | None


def verify_state(catalog: Catalog, target: str, *, storage_options: Mapping[str, Any],
                 verified_by: str | None = None) -> VerifiedState:
    """Restore snapshot `target` without the application into a scratch location, check
    every referenced file (size, sha256), read every state store of every operator and
    partition, and record the outcome next to the snapshot (level ``state``, by
    `verified_by`; default: ``sparkpoint verify (<user>@<host>)``).

    :raises CommandFailed: the snapshot cannot be found or opened (`RestoreError`).
    """
    from airflow_sparkpoint.exceptions import RestoreError
    from airflow_sparkpoint.runtime.verify import default_verifier, record_verification, verify

    options = dict(storage_options)
    try:
        result = verify(target, catalog=catalog, storage_options=options)
    except RestoreError as exc:
        raise CommandFailed(str(exc)) from None
    unrecorded: str | None = None
    try:
        if result.found:
            by = verified_by or f"sparkpoint verify ({default_verifier()})"
            record_verification(result.uri, result.record("state", by), storage_options=options)
    except StorageError as exc:
        unrecorded = f"the outcome could not be recorded next to the snapshot: {exc}"
    document = {"job": catalog.job, "root": catalog.uri, **result.to_json()}
    return VerifiedState(result, document, unrecorded)
