"""What a batch staged for a `DeltaSink` must satisfy before it is recorded: its columns
and types match the table's, and a merge's keys are columns with one row per key. A batch
refused here fails while it is staged, before its checkpoint completes, not at every
commit after it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow_sparkpoint.exceptions import SinkError
from airflow_sparkpoint.sinks.base import StageContext

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

__all__ = ["check_columns", "check_schema", "check_unique_keys", "duplicate_keys", "types_compatible"]


def check_columns(sink: object, schema: pa.Schema, ctx: StageContext, keys: Sequence[str],
                  partition_by: Sequence[str]) -> None:
    """Merge keys and partition columns must be columns of the batch (else every commit of
    it would fail: a batch that can never be committed).

    :raises SinkError: naming `sink`, the columns and the batch.
    """
    names = set(schema.names)
    for what, columns in (("merge keys", keys), ("partition_by", partition_by)):
        missing = [c for c in columns if c not in names]
        if missing:
            raise SinkError(
                f"{sink!r}: {what} {missing} are not columns of batch {ctx.batch_id} of job {ctx.job!r} "
                f"(columns: {sorted(names)})"
            )


def check_unique_keys(sink: object, files: Sequence[Mapping[str, Any]], ctx: StageContext,
                      keys: Sequence[str], read_parquet: Callable[..., pa.Table]) -> None:
    """A merge needs one row per key per batch.

    :raises SinkError: naming `sink`, the key columns and a few duplicate keys.
    """
    import pyarrow as pa

    parts = [read_parquet(f["path"], columns=keys) for f in files]
    if not parts:
        return
    dupes = duplicate_keys(pa.concat_tables(parts, promote_options="permissive"), keys)
    if dupes.num_rows:
        sample = dupes.slice(0, 5).to_pylist()
        examples = ", ".join(
            "{" + ", ".join(f"{k}={row[k]!r}" for k in keys) + f"}} x{row['count_all']}" for row in sample
        )
        raise SinkError(
            f"{sink!r}: batch {ctx.batch_id} of job {ctx.job!r} has {dupes.num_rows} merge key(s) "
            f"{list(keys)} with more than one row (e.g. {examples}); a merge needs "
            "one row per key per batch. "
            "Deduplicate or aggregate the rows by the keys in the query; the batch was not recorded and "
            "runs again when the job restarts"
        )


def check_schema(table: DeltaTable | None, schema: pa.Schema, uri: str) -> None:
    """A batch whose columns or types differ from the table (at `uri`) fails before staging.

    :raises SinkError: naming the columns or the column and its two types.
    """
    import pyarrow as pa

    if table is None:
        return
    existing = pa.schema(table.schema().to_arrow())
    want = {f.name: f.type for f in existing}
    got = {f.name: f.type for f in schema}
    if set(want) != set(got):
        raise SinkError(
            f"batch columns {sorted(got)} do not match Delta table {uri} columns {sorted(want)}; "
            "schema evolution is not automatic"
        )
    for name, typ in got.items():
        if not types_compatible(want[name], typ):
            raise SinkError(f"column {name!r} is {typ} in the batch but {want[name]} in Delta table {uri}")


def duplicate_keys(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The values of `keys` that have more than one row in `rows` (``count_all``: how many)."""
    import pyarrow.compute as pc

    counts = rows.group_by(list(keys)).aggregate([([], "count_all")])
    return counts.filter(pc.greater(counts["count_all"], 1))


def types_compatible(table_type: pa.DataType, batch_type: pa.DataType) -> bool:
    """Whether a batch column of `batch_type` may be written to a table column of `table_type`."""
    import pyarrow as pa

    if table_type == batch_type:
        return True
    # Delta stores strings as large_string/string_view and timestamps without zone info.
    for check in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view):
        if check(batch_type):
            return pa.types.is_string(table_type) or pa.types.is_large_string(table_type) or \
                pa.types.is_string_view(table_type)
    return bool(pa.types.is_timestamp(table_type) and pa.types.is_timestamp(batch_type))
