"""OpenLineage facets of the Sparkpoint operators (``get_openlineage_facets_on_complete``).

Each operator reports its output dataset (named as its Airflow asset,
`airflow_sparkpoint.assets`, split the way Airflow's own asset converters split ``file``
and ``s3`` URIs: namespace ``s3://bucket`` / ``file``, name the key or path) and a
``sparkpoint`` run facet: job, generation, restored-from snapshot, last checkpoint,
savepoint and the committed batches.

The OpenLineage provider is optional: nothing here imports it until the provider's
listener asks an operator for its facets.
"""

from __future__ import annotations

import functools
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from airflow_sparkpoint import assets

__all__ = ["FACET", "FACET_FIELDS", "commit_lineage", "dataset_name", "operator_lineage", "run_facet",
           "savepoint_lineage", "submit_lineage"]

#: the key of the run facet in OpenLineage events
FACET = "sparkpoint"
FACET_FIELDS = ("job", "generation", "restored_from", "last_checkpoint", "savepoint", "committed_batches")


def dataset_name(uri: str) -> tuple[str, str]:
    """``(namespace, name)`` of the OpenLineage dataset of an asset URI."""
    parsed = urllib.parse.urlsplit(uri)
    if parsed.scheme == "file":
        return ("file://" + parsed.netloc if parsed.netloc else "file"), parsed.path
    return (f"{parsed.scheme}://{parsed.netloc}",
            parsed.path.lstrip("/") if parsed.scheme == "s3" else parsed.path)


@functools.cache
def _facet_class() -> type:
    import attrs
    from airflow.providers.common.compat.openlineage.facet import RunFacet

    @attrs.define
    class SparkpointRunFacet(RunFacet):  # type: ignore[misc,valid-type]
        """What Sparkpoint knows of the run: see `FACET_FIELDS`."""

        job: str
        generation: int | None = None
        restored_from: str | None = None
        last_checkpoint: str | None = None
        savepoint: str | None = None
        committed_batches: list[int] = attrs.field(factory=list)

    return SparkpointRunFacet


def run_facet(**fields: Any) -> Any:
    """The ``sparkpoint`` run facet (fields: `FACET_FIELDS`)."""
    return _facet_class()(**{k: fields.get(k) for k in FACET_FIELDS if fields.get(k) is not None})


def operator_lineage(outputs: Iterable[str], **fields: Any) -> Any:
    """An ``OperatorLineage`` with datasets for the asset URIs `outputs` and the run facet."""
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage

    datasets = [Dataset(namespace=namespace, name=name) for namespace, name in map(dataset_name, outputs)]
    return OperatorLineage(outputs=datasets, run_facets={FACET: run_facet(**fields)})


def _output_uris(operator: Any) -> list[str]:
    sink = operator.declared_output()
    if sink is None:
        return []
    try:
        return [sink.location_uri]
    except NotImplementedError:
        return []


def submit_lineage(operator: Any) -> Any:
    """The lineage of a `SparkpointSubmitOperator` run (its run result)."""
    result: Mapping[str, Any] = operator.sparkpoint_result or {}
    run = operator.sparkpoint_run or {}
    committed = [*(result.get("recovered") or {}).get("committed", ()), *result.get("committed_batches", ())]
    return operator_lineage(
        _output_uris(operator), job=operator.job_name,
        generation=result.get("generation") or run.get("generation"),
        restored_from=result.get("restored_from"), last_checkpoint=result.get("last_checkpoint"),
        savepoint=result.get("savepoint"), committed_batches=sorted(set(committed)))


def commit_lineage(operator: Any) -> Any:
    """The lineage of a `SparkpointCommitOperator` step."""
    done: Mapping[str, Any] = operator.sparkpoint_outcome or {}
    return operator_lineage(_output_uris(operator), job=operator.job_name, generation=done.get("generation"),
                            last_checkpoint=done.get("last_checkpoint"),
                            committed_batches=list(done.get("committed_batches") or ()))


def savepoint_lineage(operator: Any) -> Any:
    """The lineage of a `SparkpointSavepointOperator` savepoint."""
    done: Mapping[str, Any] = operator.sparkpoint_savepoint or {}
    uri = assets.savepoints_asset_uri(operator.job_name, sparkpoint_conn_id=operator.sparkpoint_conn_id,
                                      checkpoint_dir=operator.checkpoint_dir)
    return operator_lineage([uri], job=operator.job_name, generation=done.get("generation"),
                            savepoint=done.get("savepoint"), last_checkpoint=done.get("last_checkpoint"))
