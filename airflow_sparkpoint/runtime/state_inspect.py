"""The state inside a checkpoint or savepoint, read with Spark's state data sources.

::

    from airflow_sparkpoint.runtime.state_inspect import inspect_snapshot, open_state

    state = inspect_snapshot(spark, "s3://bucket/sp/orders/savepoints/savepoint-9-1c2d3e4f")
    for op in state.operators:
        print(op.id, op.name, op.partitions, [(s.name, s.rows) for s in op.stores])

    with open_state(spark, "latest", catalog=catalog) as snap:   # what restore=latest would use
        snap.rows(store="over_limit", key={"sensor": "s1"}).show()

The snapshot is materialized into a private scratch directory (deleted on exit) and read
there with ``state-metadata`` (operators, store names, partition counts) and
``statestore`` (the rows; options ``batchId``, ``storeName``, ``joinSide``,
``stateVarName``, ``readRegisteredTimers``). The running job's live location and the
snapshot itself are never touched. The scratch directory is a local path: the Spark
application must run in local mode or see the same path on its executors.

Stores as this module names them:

* aggregation, deduplication and other single-store operators: the Spark store name
  (``default``), type ``state``;
* stream-stream joins: ``left`` and ``right`` (the buffered input rows of each side,
  type ``join``); Spark's four internal stores (``left-keyToNumValues``, ...) can be
  read by name too;
* transformWithState: one store per state variable, named like the variable, type
  ``value``, ``list`` or ``map`` (``rows``: values, list elements or map entries), in
  name order, then the registered timers (type ``timers``).

Rows come as a DataFrame with columns ``key`` and ``value`` (structs), ``map_key`` for
map state, ``ttl_expiration_ms`` for state variables with a TTL, and ``partition_id``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle, open_snapshot
from airflow_sparkpoint.exceptions import ConfigError, RestoreError, SparkpointError
from airflow_sparkpoint.runtime import spark_support
from airflow_sparkpoint.runtime.restore import materialize
from airflow_sparkpoint.storage.localfs import remove_tree_at

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import DataType

__all__ = ["OperatorSpec", "OperatorState", "SnapshotReader", "SnapshotState", "StoreSpec", "StoreState",
           "first_line", "inspect_snapshot", "key_filter", "local_session", "open_state",
           "read_operator_specs", "read_store", "resolve_snapshot", "rows_as_json", "sql_type", "state_rows"]

log = logging.getLogger(__name__)

_TWS_TYPES = {"ValueState": "value", "ListState": "list", "MapState": "map", "TimerState": "timers"}
_JOIN_SIDES = ("left", "right")
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Timestamps in JSON rows: ISO 8601 with the session time zone's offset ("Z" for UTC).
_JSON_OPTIONS = {"timestampFormat": "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX", "ignoreNullFields": "false"}


# --------------------------------------------------------------------------- results


@dataclass(frozen=True)
class StoreState:
    """One state store (or transformWithState state variable) of an operator."""

    name: str
    type: str  # state | join | value | list | map | timers
    rows: int
    keys: int
    key_schema: str
    value_schema: str
    map_key_schema: str | None = None
    ttl: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "type": self.type, "rows": self.rows, "keys": self.keys,
            "key_schema": self.key_schema, "value_schema": self.value_schema,
            "map_key_schema": self.map_key_schema, "ttl": self.ttl,
        }


@dataclass(frozen=True)
class OperatorState:
    """One stateful operator: its id in the query plan, Spark's name for it, its number
    of state partitions and its stores."""

    id: int
    name: str
    partitions: int
    stores: tuple[StoreState, ...]
    time_mode: str | None = None  # transformWithState only

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "partitions": self.partitions,
                "stores": [s.to_json() for s in self.stores], "time_mode": self.time_mode}


@dataclass(frozen=True)
class SnapshotState:
    """The state of one snapshot (``sparkpoint inspect --json``, without job/root)."""

    uri: str
    kind: str
    job: str
    batch_id: int
    operators: tuple[OperatorState, ...] = field(default_factory=tuple)

    def operator(self, operator_id: int) -> OperatorState:
        """:raises ConfigError: no such operator."""
        for op in self.operators:
            if op.id == operator_id:
                return op
        raise ConfigError(f"operator {operator_id} is not in {self.uri}; operators: {_ids(self.operators)}")

    def to_json(self) -> dict[str, Any]:
        return {"uri": self.uri, "kind": self.kind, "job": self.job, "batch_id": self.batch_id,
                "operators": [op.to_json() for op in self.operators]}


@dataclass(frozen=True)
class StoreSpec:
    """How to read one store with the ``statestore`` data source."""

    name: str
    type: str
    options: Mapping[str, str]
    ttl: bool = False


@dataclass(frozen=True)
class OperatorSpec:
    """One row group of ``state-metadata``: an operator, its stores and partitions."""

    id: int
    name: str
    partitions: int
    stores: tuple[StoreSpec, ...]  # what users see (joins: the two sides)
    physical: tuple[StoreSpec, ...]  # every store Spark keeps (joins: the four internal ones)
    time_mode: str | None = None


def _ids(operators: Any) -> str:
    return ", ".join(str(op.id) for op in operators) or "none (a stateless query)"


# --------------------------------------------------------------------------- resolving


def resolve_snapshot(
    target: str | SnapshotHandle,
    *,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> SnapshotHandle:
    """A handle on the snapshot named by `target`: a handle as it is; ``latest`` (the
    checkpoint ``restore=latest`` would use; needs `catalog`); a URI or absolute path;
    or a key under the catalog's job root (``chk-7``, ``savepoints/savepoint-7-ab12cd34``).

    :raises RestoreError: nothing valid there (missing, incomplete or corrupt), or no checkpoint yet.
    :raises ConfigError: ``latest`` or a key without a catalog.
    """
    if isinstance(target, SnapshotHandle):
        return target
    text = str(target).strip()
    if text == "latest":
        if catalog is None:
            raise ConfigError("snapshot 'latest' needs the job's catalog (--dir and --job)")
        latest = catalog.latest()
        if latest is None:
            raise RestoreError(f"job {catalog.job!r} has no completed checkpoint under {catalog.uri} "
                               "(see `sparkpoint list`)")
        return catalog.handle(latest)
    if not text:
        raise ConfigError("snapshot path is empty; expected latest, a URI, a path or a key like chk-7")
    if "://" not in text and not text.startswith("/"):
        if catalog is None:
            raise ConfigError(f"snapshot {text!r} is a key relative to a job root, but no catalog was given; "
                              "pass a URI or an absolute path")
        text = f"{catalog.uri}/{text.strip('/')}"
    return open_snapshot(text, storage_options=dict(storage_options or {}))


# --------------------------------------------------------------------------- reading


def sql_type(data_type: DataType) -> str:
    """Spark SQL's spelling of a type (``STRUCT<user: STRING, total: BIGINT>``)."""
    from pyspark.sql.types import ArrayType, MapType, StructType

    if isinstance(data_type, StructType):
        fields = ", ".join(f"{_quote(f.name)}: {sql_type(f.dataType)}" for f in data_type.fields)
        return f"STRUCT<{fields}>"
    if isinstance(data_type, ArrayType):
        return f"ARRAY<{sql_type(data_type.elementType)}>"
    if isinstance(data_type, MapType):
        return f"MAP<{sql_type(data_type.keyType)}, {sql_type(data_type.valueType)}>"
    return data_type.simpleString().upper()


def _quote(name: str) -> str:
    return name if _PLAIN_NAME.match(name) else "`" + name.replace("`", "``") + "`"


def _ensure_state_coordinator(spark: SparkSession) -> None:
    # The RocksDB provider registers with the driver's StateStoreCoordinator, which only
    # exists once the session's StreamingQueryManager does: a fresh session (the CLI's)
    # fails with "Cannot find endpoint: StateStoreCoordinator" without this.
    _ = spark.streams


def read_operator_specs(spark: SparkSession, location: str) -> list[OperatorSpec]:
    """The stateful operators of the Spark checkpoint at `location` (``state-metadata``)."""
    rows = spark.read.format("state-metadata").load(location).collect()
    grouped: dict[int, list[Any]] = {}
    for row in rows:
        grouped.setdefault(int(row["operatorId"]), []).append(row)
    specs = []
    for op_id, op_rows in sorted(grouped.items()):
        name = str(op_rows[0]["operatorName"])
        partitions = max(int(r["numPartitions"]) for r in op_rows)
        properties = _properties(op_rows[0]["operatorProperties"])
        store_names = [str(r["stateStoreName"]) for r in op_rows]
        variables = properties.get("stateVariables") if isinstance(properties, dict) else None
        time_mode = None
        if isinstance(variables, list):  # transformWithState: one store per state variable
            time_mode = str(properties.get("timeMode")) if properties.get("timeMode") else None
            # Spark lists the variables in no stable order: by name, timers last.
            stores = tuple(sorted((_variable_spec(v) for v in variables),
                                  key=lambda s: (s.type == "timers", s.name)))
            physical = stores
        elif all(n.startswith(("left-", "right-")) for n in store_names):  # stream-stream join
            stores = tuple(StoreSpec(side, "join", {"joinSide": side}) for side in _JOIN_SIDES)
            physical = tuple(StoreSpec(n, "state", {"storeName": n}) for n in store_names)
        else:
            stores = tuple(StoreSpec(n, "state", {"storeName": n}) for n in store_names)
            physical = stores
        specs.append(OperatorSpec(op_id, name, partitions, stores, physical, time_mode))
    return specs


def _properties(text: Any) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(str(text))
    except ValueError:
        log.warning("ignoring unparsable operator properties %r", text)
        return {}
    return value if isinstance(value, dict) else {}


def _variable_spec(variable: Mapping[str, Any]) -> StoreSpec:
    name = str(variable.get("stateName"))
    kind = _TWS_TYPES.get(str(variable.get("stateVariableType")), "value")
    if kind == "timers":
        return StoreSpec(name, kind, {"readRegisteredTimers": "true"})
    return StoreSpec(name, kind, {"stateVarName": name}, ttl=bool(variable.get("ttlEnabled")))


def read_store(spark: SparkSession, location: str, batch_id: int, op: OperatorSpec,
               store: StoreSpec) -> DataFrame:
    """The rows of one store at `batch_id`, normalized to ``key``, [``map_key``],
    ``value``, [``ttl_expiration_ms``], ``partition_id``."""
    from pyspark.sql import functions as F

    reader = spark.read.format("statestore").option("batchId", str(batch_id)).option("operatorId", str(op.id))
    for name, setting in store.options.items():
        reader = reader.option(name, setting)
    raw = reader.load(location)
    columns = raw.columns
    if store.type == "timers":
        return raw.select("key", F.struct(F.col("expiration_timestamp_ms")).alias("value"), "partition_id")
    column = ("user_map_value" if store.type == "map"
              else "list_element" if "list_element" in columns else "value")
    value, ttl = _unwrap_ttl(raw, column, store.ttl)
    selected = [F.col("key"), value.alias("value")]
    if store.type == "map":
        selected.insert(1, F.col("user_map_key").alias("map_key"))
    if ttl is not None:
        selected.append(ttl.alias("ttl_expiration_ms"))
    return raw.select(*selected, F.col("partition_id"))


def _unwrap_ttl(raw: DataFrame, column: str, ttl: bool) -> tuple[Column, Column | None]:
    """State variables with a TTL store ``struct<value, ttlExpirationMs>``: split them."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    data_type = raw.schema[column].dataType
    names = data_type.names if isinstance(data_type, StructType) else []
    if ttl and sorted(names) == ["ttlExpirationMs", "value"]:
        return F.col(column)["value"], F.col(column)["ttlExpirationMs"]
    return F.col(column), None


def key_filter(df: DataFrame, key: Mapping[str, Any]) -> DataFrame:
    """Only rows whose key has these field values.

    :raises ConfigError: a field is not part of the key (the message lists the key's fields).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    key_type = df.schema["key"].dataType
    fields = {f.name: f.dataType for f in key_type.fields} if isinstance(key_type, StructType) else {}
    for name, wanted in key.items():
        if name not in fields:
            raise ConfigError(f"key field {name!r} is not in this store's key; its fields are: "
                              f"{', '.join(fields) or 'none'}")
        column = F.col("key")[name]
        df = df.where(column.isNull() if wanted is None else column == F.lit(wanted).cast(fields[name]))
    return df


def rows_as_json(df: DataFrame, limit: int | None = None) -> list[dict[str, Any]]:
    """Rows of a normalized store DataFrame as JSON objects (``key``, ``value``,
    ``partition``, and ``map_key`` / ``ttl_expiration_ms`` when present), ordered by
    key (and map key) so that a limit gives a stable answer."""
    from pyspark.sql import functions as F

    order = [c for c in ("key", "map_key", "value") if c in df.columns]
    ordered = df.orderBy(*order)
    if limit is not None:
        ordered = ordered.limit(limit)
    payload = ordered.select(F.to_json(F.struct(*[F.col(c) for c in df.columns]), _JSON_OPTIONS).alias("j"))
    result = []
    for row in payload.collect():
        data = json.loads(row["j"])
        item = {"key": data.get("key"), "value": data.get("value")}
        if "map_key" in data:
            item["map_key"] = data["map_key"]
        if "ttl_expiration_ms" in data:
            item["ttl_expiration_ms"] = data["ttl_expiration_ms"]
        item["partition"] = data.get("partition_id")
        result.append(item)
    return result


class SnapshotReader:
    """A snapshot materialized into a private scratch directory, readable with Spark's
    state data sources. Use as a context manager (`open_state`); the scratch directory
    is deleted on exit. DataFrames it returns are only readable until then.
    """

    def __init__(self, spark: SparkSession, handle: SnapshotHandle, *, location: str | None = None,
                 scratch_dir: str | None = None) -> None:
        spark_support.require("state inspect and verify", spark.version)  # before any scratch copy
        self.spark = spark
        self.handle = handle
        self._given_location = location
        self._scratch_parent = scratch_dir
        self._scratch: str | None = None
        self.location = location or ""
        self._specs: list[OperatorSpec] | None = None

    def __enter__(self) -> SnapshotReader:  # noqa: PYI034 - not subclassed
        if self._given_location is None:
            self._scratch = tempfile.mkdtemp(prefix="sparkpoint-state-", dir=self._scratch_parent)
            self.location = os.path.join(self._scratch, "checkpoint")
            try:
                materialize(self.handle, self.location, stored=False)
            except BaseException:
                self.close()
                raise
        _ensure_state_coordinator(self.spark)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._scratch is not None:
            remove_tree_at(self._scratch)
            self._scratch = None

    @property
    def batch_id(self) -> int:
        return self.handle.metadata.batch_id

    @property
    def stateful(self) -> bool:
        return bool(self.handle.metadata.partitions_by_operator)

    def operator_specs(self) -> list[OperatorSpec]:
        """Spark's view of the operators (``state-metadata``); empty for a stateless query."""
        if self._specs is None:
            self._specs = read_operator_specs(self.spark, self.location) if self.stateful else []
        return self._specs

    def store_spec(self, operator: int | None = None,
                   store: str | None = None) -> tuple[OperatorSpec, StoreSpec]:
        """The operator (default: the first) and store (default: its first) to read.

        :raises ConfigError: no such operator or store (the message lists what there is).
        """
        specs = self.operator_specs()
        if not specs:
            raise ConfigError(f"{self.handle.uri} has no state: the query has no stateful operator")
        if operator is None:
            op = specs[0]
        else:
            matches = [s for s in specs if s.id == operator]
            if not matches:
                raise ConfigError(f"operator {operator} is not in {self.handle.uri}; "
                                  f"operators: {_ids(specs)}")
            op = matches[0]
        if store is None:
            return op, op.stores[0]
        for candidate in (*op.stores, *op.physical):
            if candidate.name == store:
                return op, candidate
        names = ", ".join(s.name for s in op.stores)
        raise ConfigError(f"store {store!r} is not a store of operator {op.id} "
                          f"({op.name}); its stores: {names}")

    def rows(self, operator: int | None = None, store: str | None = None,
             key: Mapping[str, Any] | None = None) -> DataFrame:
        """The rows of one store (see the module docstring for the columns), optionally
        only those whose key has the field values in `key`.

        :raises ConfigError: unknown operator, store or key field.
        """
        op, spec = self.store_spec(operator, store)
        df = read_store(self.spark, self.location, self.batch_id, op, spec)
        return key_filter(df, key) if key else df

    def state(self) -> SnapshotState:
        """Operators, stores, schemas, partitions and row counts (one Spark job per store)."""
        from pyspark.sql import functions as F

        operators = []
        for op in self.operator_specs():
            stores = []
            for spec in op.stores:
                df = read_store(self.spark, self.location, self.batch_id, op, spec)
                counts = df.agg(F.count(F.lit(1)).alias("rows"),
                                F.count_distinct("key").alias("keys")).first()
                assert counts is not None  # an aggregate without grouping has one row
                schema = df.schema
                stores.append(StoreState(
                    name=spec.name, type=spec.type, rows=int(counts["rows"]), keys=int(counts["keys"]),
                    key_schema=sql_type(schema["key"].dataType),
                    value_schema=sql_type(schema["value"].dataType),
                    map_key_schema=(sql_type(schema["map_key"].dataType) if "map_key" in schema.names
                                    else None),
                    ttl=spec.ttl,
                ))
            operators.append(OperatorState(op.id, op.name, op.partitions, tuple(stores), op.time_mode))
        meta = self.handle.metadata
        return SnapshotState(self.handle.uri, meta.kind, meta.job, meta.batch_id, tuple(operators))


@contextmanager
def open_state(
    spark: SparkSession,
    target: str | SnapshotHandle,
    *,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
    scratch_dir: str | None = None,
) -> Iterator[SnapshotReader]:
    """Materialize the snapshot `target` (see `resolve_snapshot`) into a private scratch
    directory under `scratch_dir` (default: the system's temporary directory) and yield a
    `SnapshotReader` over it; the directory is deleted on exit.

    :raises RestoreError: the snapshot is missing, incomplete or corrupt.
    """
    handle = resolve_snapshot(target, catalog=catalog, storage_options=storage_options)
    with SnapshotReader(spark, handle, scratch_dir=scratch_dir) as reader:
        yield reader


def inspect_snapshot(
    spark: SparkSession,
    target: str | SnapshotHandle,
    *,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
    scratch_dir: str | None = None,
) -> SnapshotState:
    """Operators, stores, schemas, partition counts and row counts of a snapshot.

    :raises RestoreError: the snapshot is missing, incomplete or corrupt.
    :raises SparkpointError: Spark cannot read its state.
    """
    with open_state(spark, target, catalog=catalog, storage_options=storage_options,
                    scratch_dir=scratch_dir) as reader:
        try:
            return reader.state()
        except ConfigError:
            raise
        except Exception as exc:
            raise SparkpointError(f"cannot read the state of {reader.handle.uri}: {first_line(exc)}") from exc


def state_rows(
    spark: SparkSession,
    target: str | SnapshotHandle,
    *,
    operator: int | None = None,
    store: str | None = None,
    key: Mapping[str, Any] | None = None,
    catalog: Catalog | None = None,
    storage_options: Mapping[str, Any] | None = None,
    scratch_dir: str | None = None,
) -> DataFrame:
    """The rows of one store of a snapshot as a DataFrame that stays readable after the
    scratch copy is deleted (it is computed once and kept by Spark: ``localCheckpoint``).
    For large stores prefer `open_state` and read lazily inside the ``with`` block.

    :raises ConfigError: unknown operator, store or key field.
    :raises RestoreError: the snapshot is missing, incomplete or corrupt.
    """
    with open_state(spark, target, catalog=catalog, storage_options=storage_options,
                    scratch_dir=scratch_dir) as reader:
        return reader.rows(operator, store, key).localCheckpoint(eager=True)


def first_line(exc: BaseException) -> str:
    """The first meaningful line of an exception's message (Spark's are long)."""
    text = str(exc).strip() or exc.__class__.__name__
    line = text.splitlines()[0].strip()
    return line[:500]


def local_session(app_name: str = "sparkpoint-state") -> SparkSession:
    """The active SparkSession, or a small local one for reading state (the CLI's)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    spark = (
        SparkSession.builder.master(os.environ.get("SPARKPOINT_SPARK_MASTER", "local[2]"))
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.log.level", "ERROR")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
