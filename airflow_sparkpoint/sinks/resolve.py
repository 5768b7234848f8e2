"""Which sink settles a transaction record (issue #28: a sink's configuration never
comes from a record).

A transaction record lives in the checkpoint store, which is a shared place: whoever
can write it can forge a record naming any destination. So the commit step, the
rollback and restore-time recovery act through the sink the job or the operator
*declared*, and refuse a record whose sink does not match it (`resolve_sink`).

When no sink is declared (the commit step run with no ``sink=``, as releases before
this one did), the sink is rebuilt from the record: residual trust, logged as a warning
once per step. Even then the record can only reach its own sink root: every path it
names is confined (`airflow_sparkpoint.storage.paths.confine`) to that root, staging
only inside the root's Sparkpoint staging area, by the sinks themselves.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord, foreign_to
from airflow_sparkpoint.exceptions import ConfigError, SinkError
from airflow_sparkpoint.sinks.base import Sink, check_settler
from airflow_sparkpoint.sinks.registry import sink_from_config

log = logging.getLogger(__name__)

__all__ = ["SinkSpec", "check_job", "declared_sink", "resolve_sink", "warn_undeclared"]

#: a declared sink: a `Sink`, or its config mapping with its ``kind``
#: (``{"kind": "delta", "uri": "s3://b/t", "mode": "merge", "keys": ["id"]}``)
SinkSpec = Sink | Mapping[str, Any]


def declared_sink(spec: SinkSpec | None) -> Sink | None:
    """The `Sink` a job or an operator declared (None when `spec` is None).

    :raises ConfigError: `spec` is neither a Sink nor a mapping with a known ``kind``
        and that sink's constructor arguments.
    """
    if spec is None or isinstance(spec, Sink):
        return spec
    if not isinstance(spec, Mapping) or not isinstance(spec.get("kind"), str):
        raise ConfigError(f"sink {spec!r} is not a sink; expected a Sink (e.g. DeltaSink(...)) or a mapping "
                          "like {'kind': 'directory', 'uri': '/data/out'}")
    config = {k: v for k, v in spec.items() if k != "kind"}
    try:
        return sink_from_config(str(spec["kind"]), config)
    except TypeError as exc:
        raise ConfigError(f"sink {spec!r} has arguments its kind does not take ({exc})") from None


def check_job(record: TransactionRecord, job: str, *, restored_job: str | None = None) -> None:
    """Refuse a record that is not `job`'s to settle (`metadata.foreign_to`, the one rule;
    `restored_job`: the job whose snapshot a restore with ``allowForeignJob`` took).

    :raises SinkError: it names another job; nothing of its sink is touched.
    """
    problem = foreign_to(record, job, restored_job=restored_job)
    if problem is not None:
        raise SinkError(problem)


def resolve_sink(record: TransactionRecord, declared: Sink | None, *, job: str | None = None,
                 restored_job: str | None = None) -> Sink:
    """The sink that settles `record`: `declared` when there is one, else one rebuilt
    from the record (residual trust; its paths are confined by the sink). With `job` (the
    settling job), a record of another job is refused first (`check_job`).

    :raises SinkError: the record is another job's, names another sink than `declared`
        (kind or destination), or a sink class that settles differently from the one at
        hand (`check_settler`), or, undeclared, its config is missing or unusable.
    :raises ConfigError: undeclared, the record's sink kind is unknown.
    """
    if job is not None:
        check_job(record, job, restored_job=restored_job)
    if declared is not None:
        if record.sink != declared.kind or record.sink_id != declared.sink_id:
            raise SinkError(
                f"transaction record {record.txn_id} names sink {record.sink}:{record.sink_id}, "
                f"which does not match the declared sink {declared.kind}:{declared.sink_id}; "
                "refused (a record for another destination is forged or belongs to another deployment)"
            )
        check_settler(record, declared)
        return declared
    config = record.payload.get("config") if isinstance(record.payload, Mapping) else None
    if not isinstance(config, Mapping):
        raise SinkError(
            f"transaction record {record.txn_id} has no sink config (payload.config); "
            "expected a record written by the Sparkpoint runtime, or declare the job's sink"
        )
    try:
        sink = sink_from_config(record.sink, config)  # ConfigError: an unknown kind
    except TypeError as exc:
        raise SinkError(f"transaction record {record.txn_id} has an unusable sink config ({exc}); "
                        "declare the job's sink") from None
    check_settler(record, sink)
    return sink


def warn_undeclared(job: str) -> None:
    """The warning of a step that trusts its records' sink configs."""
    log.warning(
        "no sink declared for the commit step of job %s: its sinks are rebuilt from the transaction records "
        "in the checkpoint store (every path confined to the record's own sink root). Declare the job's sink "
        "(SparkpointCommitOperator(sink=...), `sparkpoint commit --sink KIND:URI`) so that a record for any "
        "other destination is refused", job)
