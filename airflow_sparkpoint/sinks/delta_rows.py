"""The rows readers see in a Delta table, read by delta-rs' own engine: the one reader
for the hook, the services and the tests (its own concern, beside where a table lives,
`sinks._delta_location`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pyarrow as pa
    from deltalake import DeltaTable

__all__ = ["read_table"]


def read_table(table: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """The rows readers see in `table` (its loaded version), `columns` only when given,
    with the table's Arrow schema.

    Read by delta-rs' own engine, not ``table.to_pyarrow_table()``: that scans through a
    Python filesystem whose buffers can outlive the read on Arrow's I/O threads and abort
    the process at interpreter exit (`airflow_sparkpoint.process_exit`).

    :raises ValueError: `columns` is empty or names a column the table does not have.
    """
    import pyarrow as pa
    from deltalake import QueryBuilder

    schema = pa.schema(table.schema().to_arrow())
    names = list(schema.names if columns is None else columns)
    unknown = [name for name in names if name not in schema.names]
    if unknown or not names:
        raise ValueError(f"columns {unknown} are not in the Delta table "
                         f"{table.table_uri}; it has {schema.names}")
    wanted = pa.schema([schema.field(name) for name in names])
    select = ", ".join('"' + name.replace('"', '""') + '"' for name in names)
    reader = QueryBuilder().register("t", table).execute(f"SELECT {select} FROM t")
    # delta-rs returns string views; callers compare and write with the table's own types.
    return pa.table(reader.read_all()).cast(wanted)
