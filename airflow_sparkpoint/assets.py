"""Airflow assets of Sparkpoint jobs: what a pipeline writes and the savepoints it takes.

One rule names them, and every producer (the operators' asset events, the watchers'
triggers, the OpenLineage datasets) and every consumer DAG uses it:

=====================  ====================================================================
asset                  URI (also its name)
=====================  ====================================================================
a job's output         the declared sink's location (`Sink.location_uri`): the Delta table
                       (``s3://bucket/table``, ``file:///data/table``), the S3 prefix, the
                       directory
a job's savepoints     ``sparkpoint://<connection id>/<job>/savepoints`` when the store is
                       named by a ``sparkpoint`` connection; ``<storage root>/<job>/savepoints``
                       (``file:///...``, ``s3://...``) when by ``checkpoint_dir``
=====================  ====================================================================

Airflow lower-cases the scheme, drops a trailing slash and refuses the ``airflow`` scheme
(`airflow.sdk.definitions.asset._sanitize_uri`); ``sparkpoint`` has no URI normalizer, so
it is kept as written. The asset's name is its URI, so ``Asset(uri)`` in any DAG file is
the same asset.

The ``extra`` of an asset event (`commit_extra`, `savepoint_extra`) always names the
job, the generation and what became durable, so a consumer can tell repeated events apart.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import Asset, AssetAlias

from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.services.sinks import SinkSpec, declared_sink
from airflow_sparkpoint.services.stores import SAVEPOINTS, validate_job_name

__all__ = [
    "SAVEPOINT_SCHEME", "commit_extra", "event_details", "output_alias", "savepoint_extra",
    "savepoints_asset", "savepoints_asset_uri", "sink_asset", "sink_asset_uri",
]

SAVEPOINT_SCHEME = "sparkpoint"


def sink_asset_uri(sink: SinkSpec) -> str:
    """The asset URI of a sink's output: a `Sink` or its config mapping with ``kind``
    (``{"kind": "delta", "uri": "s3://b/t", ...}``).

    :raises ConfigError: `sink` is not a sink declaration.
    :raises NotImplementedError: a custom sink that names no location.
    """
    resolved = declared_sink(sink)
    if resolved is None:
        raise ConfigError("sink=None has no asset; expected a Sink or its config mapping with 'kind'")
    return resolved.location_uri


def sink_asset(sink: SinkSpec, **kwargs: Any) -> Asset:
    """The Airflow asset of a sink's output (named by its URI); `kwargs` go to `Asset`
    (``watchers=[...]``, ``group=...``)."""
    uri = sink_asset_uri(sink)
    return Asset(name=uri, uri=uri, **kwargs)


def savepoints_asset_uri(job_name: str, *, sparkpoint_conn_id: str | None = None,
                         checkpoint_dir: str | None = None) -> str:
    """The asset URI of a job's savepoints (see the module docstring); the connection wins
    when both are given, as in the operators.

    :raises ConfigError: an invalid job name, or neither a connection nor a storage root.
    """
    validate_job_name(job_name)
    if sparkpoint_conn_id:
        return (f"{SAVEPOINT_SCHEME}://{urllib.parse.quote(sparkpoint_conn_id, safe='')}/"
                f"{job_name}/{SAVEPOINTS}")
    if not checkpoint_dir:
        raise ConfigError(f"the savepoints of job {job_name!r} have no asset without sparkpoint_conn_id or "
                          "checkpoint_dir; expected one of them")
    root = checkpoint_dir.rstrip("/")
    if "://" not in root:
        root = Path(root).absolute().as_uri()
    return f"{root}/{job_name}/{SAVEPOINTS}"


def savepoints_asset(job_name: str, *, sparkpoint_conn_id: str | None = None,
                     checkpoint_dir: str | None = None, **kwargs: Any) -> Asset:
    """The Airflow asset of a job's savepoints (named by its URI)."""
    uri = savepoints_asset_uri(job_name, sparkpoint_conn_id=sparkpoint_conn_id, checkpoint_dir=checkpoint_dir)
    return Asset(name=uri, uri=uri, **kwargs)


def output_alias(task_id: str, dag_id: str | None) -> AssetAlias:
    """The asset alias an operator declares as its outlet: the operator adds the job's
    asset to it (`outlet_events[alias].add`) only when something became durable, so a
    run that committed nothing emits no event (an `Asset` outlet always emits one)."""
    return AssetAlias(f"sparkpoint:{dag_id or '-'}.{task_id}")


def commit_extra(*, job: str, generation: int | None, batches: Iterable[int], sink_id: str,
                 sink_version: int | None, source: str) -> dict[str, Any]:
    """The ``extra`` of an output asset event: `batches` committed by this event's
    producer (`source`: ``submit``, ``commit`` or ``watcher``)."""
    committed = sorted({int(b) for b in batches})
    return {"job": job, "generation": generation, "committed_batches": committed,
            "last_batch": committed[-1] if committed else None, "sink": sink_id, "sink_version": sink_version,
            "source": source}


def savepoint_extra(*, job: str, generation: int | None, savepoint_uri: str, batch_id: int | None,
                    source: str) -> dict[str, Any]:
    """The ``extra`` of a savepoint asset event."""
    return {"job": job, "generation": generation, "savepoint": savepoint_uri, "batch": batch_id,
            "source": source}


def event_details(extra: Mapping[str, Any]) -> dict[str, Any]:
    """What an asset event of a Sparkpoint asset says, whoever emitted it: a watcher's
    trigger (Airflow keeps its payload under ``extra["payload"]``, with ``from_trigger``)
    or an operator (`commit_extra`, `savepoint_extra`: the extra itself). Both name the
    ``job`` and the ``generation``, and ``last_batch`` (output) or ``savepoint``; a
    watcher's also ``after_batch`` and ``seq``. One asset can get both kinds (a watcher
    and an operator's events on one job), so a consumer reads every event through this."""
    payload = extra.get("payload")
    return dict(payload) if extra.get("from_trigger") and isinstance(payload, Mapping) else dict(extra)
