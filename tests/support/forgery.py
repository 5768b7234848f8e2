"""What the security tests share: records forged by an attacker who can write the
catalog (`forged_record`), running an action for what it raised (`outcome`), the check
that it was refused (`assert_refused`), and the keys left in a bucket (`s3_objects`)."""

from __future__ import annotations

from typing import Any

from airflow_sparkpoint.checkpoints import TransactionRecord
from airflow_sparkpoint.sinks import sink_from_config
from tests.support.records import transaction_record

__all__ = ["JOB", "assert_refused", "forged_record", "outcome", "s3_objects"]

JOB = "orders"  # the job of the forged records


def outcome(action: Any, *args: Any, **kwargs: Any) -> BaseException | None:
    """Run `action` and return what it raised (the victim is checked before the error)."""
    try:
        action(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the caller asserts its type
        return exc
    return None


def assert_refused(exc: BaseException | None, types: Any, match: str) -> None:
    """`exc` is one of `types` and its message names `match`."""
    assert isinstance(exc, types), f"not refused with {types}: {exc!r}"
    assert match in str(exc), f"the error does not name {match!r}: {exc}"


def forged_record(batch: int, generation: int, config: dict[str, Any], staged: dict[str, Any],
                  sink_kind: str = "directory") -> TransactionRecord:
    """A transaction record of job `JOB` as an attacker who can write the catalog forges it:
    any `config` and `staged` part, with the sink id that `config` gives."""
    sink_id = sink_from_config(sink_kind, config).sink_id  # as consistent as a careful forger makes it
    return transaction_record(sink_kind, batch, generation, staged, job=JOB, sink_id=sink_id, config=config)


def s3_objects(endpoint: str, bucket: str) -> list[str]:
    """The keys of every object in `bucket` at `endpoint`, sorted."""
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    return sorted(o["Key"] for o in client.list_objects_v2(Bucket=bucket).get("Contents", ()))
