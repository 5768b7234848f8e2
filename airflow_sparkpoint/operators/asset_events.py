"""Asset events of the Sparkpoint operators: emitted when, and only when, output or a
savepoint became durable (see `airflow_sparkpoint.assets` for the names and the extra).

Each operator holds an `AssetEvents`: it declares an `AssetAlias` outlet
(`assets.output_alias`) and adds the job's asset to it at the end of a run that made
something durable: an `Asset` outlet would emit an event on every success, also for a
run that committed nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, overload

from airflow.sdk import Asset, AssetAlias

from airflow_sparkpoint import assets
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.services.history import commit_head
from airflow_sparkpoint.services.sinks import SinkSpec, declared_sink

if TYPE_CHECKING:
    from airflow.sdk import Context

    from airflow_sparkpoint.hooks.sparkpoint import SparkpointHook
    from airflow_sparkpoint.services.sinks import Sink
    from airflow_sparkpoint.services.stores import Catalog

__all__ = ["AssetAliasAttribute", "AssetEvents", "AssetEventsAttribute", "EventSource", "output_event"]


class EventSource(Protocol):
    """What `AssetEvents` reads of its operator, when it is used (after rendering)."""

    task_id: str
    outlets: list[Any]
    emit_asset_events: bool
    job_name: str

    @property
    def dag_id(self) -> str: ...

    @property
    def log(self) -> Any: ...

    @property
    def hook(self) -> SparkpointHook: ...


class AssetEvents:
    """The asset events of one operator (`EventSource`): its alias outlet (`alias`,
    declared by `declare` when the operator's `emit_asset_events` is on) and the
    events added to it (`emit`, `emit_output`)."""

    def __init__(self, operator: EventSource) -> None:
        self._operator = operator

    @classmethod
    def declare(cls, operator: EventSource, emit_asset_events: bool) -> None:
        """From `operator`'s ``__init__`` (once): set its `emit_asset_events` and, when on,
        add `alias` to its outlets."""
        operator.emit_asset_events = bool(emit_asset_events)
        if operator.emit_asset_events:
            operator.outlets = [*(operator.outlets or []), cls(operator).alias]

    @property
    def alias(self) -> AssetAlias:
        """The alias outlet the operator adds its events to."""
        try:
            dag_id = self._operator.dag_id
        except Exception:  # noqa: BLE001 - not in a DAG yet
            dag_id = None
        return assets.output_alias(self._operator.task_id, dag_id)

    def emit(self, context: Context, asset: Asset, extra: Mapping[str, Any]) -> None:
        """Add one event of `asset` to the alias outlet (none when events are off)."""
        op = self._operator
        if not op.emit_asset_events:
            return
        alias = next((o for o in op.outlets
                      if isinstance(o, AssetAlias) and o.name.startswith("sparkpoint:")), None)
        if alias is None:  # the outlets were replaced after __init__
            op.log.warning("no Sparkpoint asset alias among the outlets of %s; no asset event for %s",
                           op.task_id, asset.uri)
            return
        events = context.get("outlet_events")
        if events is None:  # called outside Airflow's task runner (no event can be recorded)
            op.log.warning("no outlet_events in the context of %s; no asset event for %s", op.task_id,
                           asset.uri)
            return
        events[alias].add(asset, extra=dict(extra))
        op.log.info("asset event for %s: %s", asset.uri, dict(extra))

    def declared_output(self, sink: SinkSpec | None) -> Sink | None:
        """The job's declared sink (`sink`, else the connection's ``jobs.<job>.sink``), or
        None (logged when a declaration is unusable: the run itself succeeded)."""
        op = self._operator
        try:
            return declared_sink(sink) if sink is not None else op.hook.declared_sink(op.job_name)
        except SparkpointError as exc:
            op.log.warning("the sink of job %s is not usable for its asset: %s", op.job_name, exc)
            return None

    def emit_output(self, context: Context, catalog: Catalog, sink: Sink | None, *, generation: int | None,
                    batches: Iterable[int], txn_ids: Iterable[str] = (),
                    source: str) -> dict[str, Any] | None:
        """Emit the output asset event of `batches` (none when nothing was committed);
        returns its extra."""
        if not self._operator.emit_asset_events:
            return None
        event = output_event(catalog, sink, generation=generation, batches=batches, txn_ids=txn_ids,
                             source=source, log=self._operator.log)
        if event is None:
            return None
        self.emit(context, *event)
        return event[1]


class AssetEventsAttribute:
    """An operator's ``_asset_events`` (``_asset_events = AssetEventsAttribute()``): its
    `AssetEvents`, bound to the operator it is read on, as a method is. Airflow runs a
    shallow copy of the task it parsed (``prepare_for_execution``) and renders the
    templates onto the copy: a part held from ``__init__`` would read the parsed task's
    unrendered fields."""

    @overload
    def __get__(self, op: None, owner: type) -> AssetEventsAttribute: ...

    @overload
    def __get__(self, op: EventSource, owner: type | None = None) -> AssetEvents: ...

    def __get__(self, op: EventSource | None, owner: type | None = None) -> Any:
        if op is None:
            return self
        return AssetEvents(op)


class AssetAliasAttribute:
    """An operator's ``assets_alias`` (``assets_alias = AssetAliasAttribute()``): the alias
    outlet its `AssetEvents` adds the events to."""

    @overload
    def __get__(self, op: None, owner: type) -> AssetAliasAttribute: ...

    @overload
    def __get__(self, op: EventSource, owner: type | None = None) -> AssetAlias: ...

    def __get__(self, op: EventSource | None, owner: type | None = None) -> Any:
        if op is None:
            return self
        return AssetEvents(op).alias


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
