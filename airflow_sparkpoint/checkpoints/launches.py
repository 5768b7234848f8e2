"""The launch record: where a submit started its driver, for on-call engineers and
`sparkpoint status`.

``<job>/launches/<token>.json``, written once by the submitting task right after the
launch (before the driver claims its generation, so a task lost in between still left
it); the driver's generation claim names the same token (``submitter``), which is how a
reader goes from the current generation to its launch. `driver` says where it runs:

- ``{"kind": "process", "host", "pgid", "log"}``: a detached client-mode driver (its
  process group on the Airflow worker `host`);
- ``{"kind": "kubernetes", "namespace", "pod"}``: the driver pod of a cluster-mode submit;
- ``{"kind": "yarn", "application_id"}``: the YARN application of a cluster-mode submit.

Pure Python, no Spark, no Airflow. A record read back is untrusted: `from_json` checks it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_sparkpoint.checkpoints import bounded, layout
from airflow_sparkpoint.checkpoints.catalog import Catalog

__all__ = ["DRIVER_KINDS", "SCHEMA_VERSION", "LaunchRecord", "describe_driver", "read_launch", "write_launch"]

SCHEMA_VERSION = 1
#: the kinds of place a driver runs, and the text fields each names
DRIVER_KINDS: Mapping[str, tuple[str, ...]] = {
    "process": ("host", "log"),
    "kubernetes": ("namespace", "pod"),
    "yarn": ("application_id",),
}
_TEXT_MAX = 1024


def _check_driver(driver: Any) -> dict[str, Any]:
    """:raises ValueError: not a driver place of a known kind with its fields."""
    if not isinstance(driver, Mapping) or driver.get("kind") not in DRIVER_KINDS:
        raise ValueError(f"driver {driver!r} is invalid; expected a mapping with kind one of "
                         + ", ".join(DRIVER_KINDS))
    kind = str(driver["kind"])
    checked: dict[str, Any] = {"kind": kind}
    for name in DRIVER_KINDS[kind]:
        value = driver.get(name, "")
        if not isinstance(value, str) or len(value) > _TEXT_MAX:
            raise ValueError(f"driver {name}={value!r} is invalid; expected a string")
        checked[name] = value
    if kind == "process":
        pgid = driver.get("pgid")
        if isinstance(pgid, bool) or not isinstance(pgid, int):
            raise ValueError(f"driver pgid={pgid!r} is invalid; expected an integer")
        checked["pgid"] = pgid
    return checked


def describe_driver(driver: Mapping[str, Any]) -> str:
    """One line saying where the driver runs (for the CLI and the task log)."""
    kind = driver.get("kind")
    if kind == "kubernetes":
        return f"Kubernetes pod {driver.get('namespace')}:{driver.get('pod')}"
    if kind == "yarn":
        return f"YARN application {driver.get('application_id')}"
    host, log = driver.get("host") or "?", driver.get("log") or "?"
    return f"process group {driver.get('pgid')} on host {host} (log {log})"


@dataclass(frozen=True)
class LaunchRecord:
    """Where the submit with token `token` started its driver (see the module docstring)."""

    token: str
    deploy_mode: str
    driver: Mapping[str, Any]
    launched_at: float = field(default_factory=time.time)
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"token": self.token, "deploy_mode": self.deploy_mode, "driver": dict(self.driver),
                "launched_at": self.launched_at, "schema_version": self.schema_version}

    @classmethod
    def from_json(cls, body: Any) -> LaunchRecord:
        """:raises ValueError: not a launch record of a known schema."""
        if not isinstance(body, dict) or body.get("schema_version") != SCHEMA_VERSION:
            raise ValueError("not a launch record of schema version 1")
        token, mode, at = body.get("token"), body.get("deploy_mode"), body.get("launched_at")
        layout.launch_key(str(token))  # a valid token or ConfigError (a ValueError)
        if not isinstance(token, str):
            raise ValueError(f"token={token!r} is invalid; expected a string")  # noqa: TRY004
        if mode not in ("client", "cluster"):
            raise ValueError(f"deploy_mode={mode!r} is invalid; expected client or cluster")
        if isinstance(at, bool) or not isinstance(at, (int, float)):
            raise ValueError(f"launched_at={at!r} is invalid; expected epoch seconds")  # noqa: TRY004
        return cls(token=token, deploy_mode=mode, driver=_check_driver(body.get("driver")),
                   launched_at=float(at))

    def describe(self) -> str:
        return describe_driver(self.driver)


def write_launch(catalog: Catalog, record: LaunchRecord) -> None:
    """Write `record` (once per submit: its token is new).

    :raises ConfigError: the token is invalid. :raises ValueError: the driver place is.
    :raises CatalogError: the record would be over its limits.
    :raises StorageError: the store cannot be written.
    """
    key = layout.launch_key(record.token)
    LaunchRecord.from_json(record.to_json())  # what a reader would refuse is never written
    body = json.dumps(record.to_json(), sort_keys=True).encode()
    bounded.check_writable(body, layout.limits_of(key), key)
    catalog.store.put(key, body)


def read_launch(catalog: Catalog, token: str) -> LaunchRecord | None:
    """The launch record of the submit with token `token`, or None when it wrote none
    (a driver not started by a submit, or by a release before this one).

    :raises ConfigError: the token is invalid.
    :raises CorruptRecord: the record is unreadable.
    :raises StorageError: the store cannot be read.
    """
    key = layout.launch_key(token)
    return bounded.read_record(catalog.store, key, LaunchRecord.from_json, limits=layout.limits_of(key),
                               where=f"launch record {key}")
