"""`SparkpointHook`: Sparkpoint storage from an Airflow connection.

Connection type ``sparkpoint``:

==============  ======================================================
field           meaning
==============  ======================================================
host            storage root URI (``s3://bucket/prefix``, ``file:///path``)
login/password  S3 access key id / secret (optional; else ``aws_conn_id`` or
                the default AWS chain)
extra           ``endpoint_url``, ``region_name``, ``aws_conn_id``
==============  ======================================================
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.storage import Storage, open_storage


class SparkpointHook(BaseHook):
    """Storage access and catalogs for Sparkpoint jobs.

    :param sparkpoint_conn_id: a connection of type ``sparkpoint``; or None with `storage_uri`.
    :param storage_uri: a storage root given directly (no connection needed for local paths).
    """

    conn_name_attr = "sparkpoint_conn_id"
    default_conn_name = "sparkpoint_default"
    conn_type = "sparkpoint"
    hook_name = "Sparkpoint"

    def __init__(self, sparkpoint_conn_id: str | None = default_conn_name, storage_uri: str | None = None) -> None:
        super().__init__()
        self.sparkpoint_conn_id = sparkpoint_conn_id
        self._storage_uri = storage_uri
        self._resolved: tuple[str, dict[str, Any]] | None = None

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        return {
            "hidden_fields": ["schema", "port"],
            "relabeling": {
                "host": "Storage URI",
                "login": "S3 access key id",
                "password": "S3 secret access key",
            },
            "placeholders": {
                "host": "s3://bucket/sparkpoint  or  file:///data/sparkpoint",
                "extra": '{"endpoint_url": "http://minio:9000", "region_name": "us-east-1", "aws_conn_id": null}',
            },
        }

    def _resolve(self) -> tuple[str, dict[str, Any]]:
        if self._resolved is not None:
            return self._resolved
        options: dict[str, Any] = {}
        uri = self._storage_uri
        if self.sparkpoint_conn_id:
            conn = self.get_connection(self.sparkpoint_conn_id)
            extra = conn.extra_dejson or {}
            uri = uri or (conn.host or "").strip() or extra.get("storage_uri")
            if extra.get("endpoint_url"):
                options["endpoint_url"] = extra["endpoint_url"]
            if extra.get("region_name"):
                options["region_name"] = extra["region_name"]
            if conn.login and conn.password:
                options["aws_access_key_id"] = conn.login
                options["aws_secret_access_key"] = conn.password
            elif extra.get("aws_conn_id"):
                options.update(self._aws_credentials(str(extra["aws_conn_id"])))
        if not uri:
            raise ConfigError(
                f"Sparkpoint connection {self.sparkpoint_conn_id!r} has no storage URI in its host field "
                "(expected e.g. s3://bucket/prefix), and no storage_uri was given"
            )
        self._resolved = (str(uri), options)
        return self._resolved

    def _aws_credentials(self, aws_conn_id: str) -> dict[str, Any]:
        conn = self.get_connection(aws_conn_id)
        options: dict[str, Any] = {}
        if conn.login and conn.password:
            options["aws_access_key_id"] = conn.login
            options["aws_secret_access_key"] = conn.password
        extra = conn.extra_dejson or {}
        if extra.get("aws_session_token"):
            options["aws_session_token"] = extra["aws_session_token"]
        if extra.get("endpoint_url") and "endpoint_url" not in options:
            options["endpoint_url"] = extra["endpoint_url"]
        if extra.get("region_name"):
            options.setdefault("region_name", extra["region_name"])
        return options

    @property
    def storage_uri(self) -> str:
        return self._resolve()[0]

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for `open_storage` and sinks (may hold credentials: never log them)."""
        return dict(self._resolve()[1])

    def get_storage(self) -> Storage:
        uri, options = self._resolve()
        return open_storage(uri, **options)

    def get_catalog(self, job_name: str) -> Catalog:
        return Catalog(self.get_storage(), job_name)

    def test_connection(self) -> tuple[bool, str]:
        try:
            storage = self.get_storage()
            check = getattr(storage, "check", None)
            if callable(check):
                check()
            else:
                list(storage.list_dirs(""))
        except Exception as exc:  # noqa: BLE001 - reported to the UI
            return False, str(exc)
        return True, f"Sparkpoint storage {self.storage_uri} is reachable"
