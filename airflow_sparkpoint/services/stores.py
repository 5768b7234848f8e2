"""A job's store, as the front ends reach it: open it (and check it is there), the
catalog type, job names, the S3 endpoint options and their check, and the one scrubber
of secrets from messages (`storage.redact`: what to register, find and scrub).

The front ends (operators, sensors, triggers, the UI plugin, the demo, the CLI) import
the core only through `airflow_sparkpoint.services`; this module is their door to the
store. Pure Python: no Spark, no Airflow.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog, SnapshotHandle
from airflow_sparkpoint.checkpoints.layout import SAVEPOINTS, is_job_dir, validate_job_name
from airflow_sparkpoint.exceptions import StorageError
from airflow_sparkpoint.storage import LocalStorage, Storage, open_storage, split_uri
from airflow_sparkpoint.storage.endpoints import ENDPOINT_URL, REGION_NAME, s3_options, validate_endpoint_url
from airflow_sparkpoint.storage.redact import register, scrub, scrub_value, secret_values, userinfo

__all__ = [
    "ENDPOINT_URL", "REGION_NAME", "SAVEPOINTS", "Catalog", "SnapshotHandle", "Storage", "has_metadata",
    "job_catalog", "jobs_under", "open_job", "open_storage", "other_jobs", "register", "s3_options", "scrub",
    "scrub_value",
    "secret_values", "split_uri", "userinfo", "validate_endpoint_url", "validate_job_name",
]


def open_job(root: str, job: str, *, s3_endpoint: str | None = None, s3_region: str | None = None,
             hint: str = "") -> Catalog:
    """The catalog of `job` under the storage root `root`, once the root is known to be
    there: a local root that does not exist, a missing bucket or an unreachable endpoint
    fail here, before anything is read. The S3 endpoint and region apply to S3 roots only
    (`s3_options`); `hint` ends the message of a missing local root (``"; check --dir"``).

    :raises ConfigError: `job` is not a valid job name, or the endpoint is invalid.
    :raises InvalidPath: `root` is malformed.
    :raises StorageError: a local root does not exist, or the store cannot be reached.
    """
    validate_job_name(job)
    # S3 options mean nothing to other roots
    options = s3_options(s3_endpoint, s3_region) if split_uri(root)[0] == "s3" else {}
    storage = open_storage(root, **options)
    if isinstance(storage, LocalStorage) and not os.path.isdir(storage.root):
        raise StorageError(f"storage root {root!r} does not exist ({storage.root}){hint}")
    storage.check()
    return Catalog(storage, job)


def job_catalog(root: str | Storage, job: str, **storage_options: Any) -> Catalog:
    """The catalog of `job` on `root` (a storage URI, opened here, or an open store),
    without checking that the root exists."""
    storage = open_storage(root, **storage_options) if isinstance(root, str) else root
    return Catalog(storage, job)


def jobs_under(storage: Storage) -> Iterator[str]:
    """The jobs stored under the root `storage`, by name: its top-level directories that
    are a job's (`layout.is_job_dir`). The one rule of the CLI's and the UI's job lists.

    :raises StorageError: the root cannot be listed.
    """
    return (name for name in storage.list_dirs("") if is_job_dir(name))


def other_jobs(catalog: Catalog) -> list[str]:
    """The other jobs stored under `catalog`'s root (`jobs_under`; [] when the root cannot
    be listed)."""
    try:
        return [name for name in jobs_under(catalog.storage) if name != catalog.job]
    except StorageError:
        return []


def has_metadata(uri: str, **storage_options: Any) -> bool:
    """Whether the snapshot directory `uri` has its ``_metadata`` (is complete).

    :raises SparkpointError: the store cannot be read.
    """
    return open_storage(uri, **storage_options).exists("_metadata")
