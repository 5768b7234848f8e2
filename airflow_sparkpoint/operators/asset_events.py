"""Asset events of the Sparkpoint operators: emitted when, and only when, output or a
savepoint became durable (see `airflow_sparkpoint.assets` for the names and the extra).

Each operator declares an `AssetAlias` outlet (`assets.output_alias`) and adds the job's
asset to it at the end of a run that made something durable: an `Asset` outlet would emit
an event on every success, also for a run that committed nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import Asset, AssetAlias

from airflow_sparkpoint import assets
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.services.history import commit_head
from airflow_sparkpoint.services.sinks import SinkSpec, declared_sink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.services.sinks import Sink
    from airflow_sparkpoint.services.stores import Catalog

__all__ = ["SparkpointAssetsMixin", "output_event"]


class SparkpointAssetsMixin:
    """`emit_asset_events` and the alias outlet; `_emit` adds one event."""

    task_id: str
    dag_id: str
    outlets: list[Any]
    log: Any
    emit_asset_events: bool
    job_name: str
    sink: SinkSpec | None
    hook: Any

    def _init_assets(self, emit_asset_events: bool) -> None:
        self.emit_asset_events = bool(emit_asset_events)
        if self.emit_asset_events:
            self.outlets = [*(self.outlets or []), self.assets_alias]

    @property
    def assets_alias(self) -> AssetAlias:
        """The alias outlet this task adds its events to."""
        try:
            dag_id = self.dag_id
        except Exception:  # noqa: BLE001 - not in a DAG yet
            dag_id = None
        return assets.output_alias(self.task_id, dag_id)

    def _emit(self, context: Context, asset: Asset, extra: Mapping[str, Any]) -> None:
        if not self.emit_asset_events:
            return
        alias = next((o for o in self.outlets
                      if isinstance(o, AssetAlias) and o.name.startswith("sparkpoint:")), None)
        if alias is None:  # the outlets were replaced after __init__
            self.log.warning("no Sparkpoint asset alias among the outlets of %s; no asset event for %s",
                             self.task_id, asset.uri)
            return
        events = context.get("outlet_events")
        if events is None:  # called outside Airflow's task runner (no event can be recorded)
            self.log.warning("no outlet_events in the context of %s; no asset event for %s", self.task_id,
                             asset.uri)
            return
        events[alias].add(asset, extra=dict(extra))
        self.log.info("asset event for %s: %s", asset.uri, dict(extra))

    def declared_output(self) -> Sink | None:
        """The job's declared sink (`sink`, else the connection's ``jobs.<job>.sink``), or
        None (logged when a declaration is unusable: the run itself succeeded)."""
        try:
            return (declared_sink(self.sink) if self.sink is not None
                    else self.hook.declared_sink(self.job_name))
        except SparkpointError as exc:
            self.log.warning("the sink of job %s is not usable for its asset: %s", self.job_name, exc)
            return None

    def _emit_output(self, context: Context, catalog: Catalog, sink: Sink | None, *, generation: int | None,
                     batches: Iterable[int], txn_ids: Iterable[str] = (),
                     source: str) -> dict[str, Any] | None:
        """Emit the output asset event of `batches` (none when nothing was committed);
        returns its extra."""
        if not self.emit_asset_events:
            return None
        event = output_event(catalog, sink, generation=generation, batches=batches, txn_ids=txn_ids,
                             source=source, log=self.log)
        if event is None:
            return None
        self._emit(context, *event)
        return event[1]


def output_event(catalog: Catalog, sink: Sink | None, *, generation: int | None, batches: Iterable[int],
                 txn_ids: Iterable[str] = (), source: str, log: Any) -> tuple[Asset, dict[str, Any]] | None:
    """The output asset and the extra of an event for `batches` committed to `sink`, or
    None: nothing was committed, no sink is declared, or it names no location. The sink's
    version (Delta table version) comes from the commit head when it names one of them.
    """
    committed = sorted(set(batches))
    if not committed:
        return None
    if sink is None:
        log.info("job %s committed batches %s; no sink is declared (sink= or the "
                 "connection's jobs.<job>.sink), "
                 "so no asset event", catalog.job, committed)
        return None
    try:
        asset = assets.sink_asset(sink)
    except NotImplementedError as exc:
        log.info("no asset event for job %s: %s", catalog.job, exc)
        return None
    version = None
    try:
        head = commit_head(catalog)
    except SparkpointError as exc:
        log.warning("cannot read the commit head of job %s (the event has no sink version): %s", catalog.job,
                    exc)
        head = None
    if head is not None and head.sink_id == sink.sink_id and (
            head.txn_id in set(txn_ids) or (head.batch == committed[-1] and head.generation == generation)):
        version = head.sink_version
    extra = assets.commit_extra(job=catalog.job, generation=generation, batches=committed,
                                sink_id=sink.sink_id, sink_version=version, source=source)
    return asset, extra
