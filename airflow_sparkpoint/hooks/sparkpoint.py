"""`SparkpointHook`: Sparkpoint storage from an Airflow connection.

Connection type ``sparkpoint`` (its form is declared in `airflow_sparkpoint.get_provider_info`):

==================  ==========================================================
field               meaning
==================  ==========================================================
host                storage root URI (``s3://bucket/prefix``, ``file:///path``)
login / password    S3 access key id / secret (optional)
``endpoint_url``    S3-compatible endpoint (MinIO, SeaweedFS, ...); empty: AWS
``region_name``     S3 region
``aws_conn_id``     an Airflow ``aws`` connection for the credentials (roles,
                    profiles, session tokens), read through the Amazon
                    provider's ``AwsBaseHook``
``jobs``            optional, pipelines stored there (the UI lists every job
                    under the root to who may read the connection):
                    comma-separated names, a list, or a mapping
                    ``{"orders": {"dags": ["etl_orders"]}}`` declaring the DAGs
                    that use each (only their readers see it in the UI) and, with
                    ``"sink": {"kind": "delta", "uri": "s3://b/t", ...}``, the
                    job's sink (the commit step's when its operator declares none)
``pyspark_python``  the Python interpreter on the Spark cluster's nodes
==================  ==========================================================

Credentials, in this order: login/password; the ``aws_conn_id`` connection through
``AwsBaseHook`` (needs ``pip install 'airflow-sparkpoint[amazon]'``); else none are set
and boto3's default chain applies (environment, profile, instance role) — in this
process and in the ``spark-submit`` it starts. They are never parsed by hand. An endpoint
URL with ``user:password@`` is refused (`validate_endpoint_url`): it would reach the
Spark conf, which the Spark UI shows. Messages shown to users go through `scrub`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from airflow.sdk import BaseHook

from airflow_sparkpoint.checkpoints import Catalog, TransactionRecord
from airflow_sparkpoint.exceptions import ConfigError
from airflow_sparkpoint.get_provider_info import CONN_FIELDS, UI_FIELD_BEHAVIOUR
from airflow_sparkpoint.services import sinks, stores
from airflow_sparkpoint.services.sinks import Sink, declared_sink
from airflow_sparkpoint.services.stores import (
    ENDPOINT_URL,
    REGION_NAME,
    s3_options,
    validate_endpoint_url,
    validate_job_name,
)
from airflow_sparkpoint.storage import Storage, open_storage, split_uri

__all__ = ["DEFAULT_CONN_ID", "DeclaredJob", "SparkpointHook", "declared_jobs", "extra_field", "scrub",
           "storage_connection"]

log = logging.getLogger(__name__)

#: extra fields that hold no secret (every other extra value, nested ones too, is scrubbed
#: from messages; of ``storage_uri`` and ``endpoint_url``, their ``user:password``)
_PLAIN_EXTRA = frozenset({*CONN_FIELDS, "jobs", "storage_uri"})
_CREDENTIAL_OPTIONS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


#: the connection every operator, sensor, trigger and the hook read when none is named
DEFAULT_CONN_ID = "sparkpoint_default"


def storage_connection(checkpoint_dir: str | None, sparkpoint_conn_id: str | None) -> str | None:
    """The connection a task or trigger reads for the job's store: `sparkpoint_conn_id`
    when named; none when only a storage root (`checkpoint_dir`) is given; else
    ``sparkpoint_default``, the hook's default."""
    if sparkpoint_conn_id:
        return sparkpoint_conn_id
    return None if checkpoint_dir else DEFAULT_CONN_ID


def extra_field(extra: Mapping[str, Any], name: str, conn_type: str = "sparkpoint") -> Any:
    """A form field from a connection's extra: plain, or as older forms stored it
    (``extra__<type>__<name>``). Empty strings count as unset."""
    for key in (name, f"extra__{conn_type}__{name}"):
        value = extra.get(key)
        if value not in (None, ""):
            return value
    return None


@dataclass(frozen=True)
class DeclaredJob:
    """A job a connection's extra ``jobs`` field lists: the DAGs it declares, and its sink
    as declared (validated by `sink`, when it is used)."""

    dags: tuple[str, ...] = ()
    sink_spec: Any = None

    def sink(self) -> Sink | None:
        """The declared sink (None: none declared).

        :raises ConfigError: the declaration is not a sink (`sinks.resolve.declared_sink`).
        """
        return declared_sink(self.sink_spec)


def declared_jobs(extra: Mapping[str, Any]) -> dict[str, DeclaredJob]:
    """The jobs a connection's extra ``jobs`` field lists, each with the DAGs and the sink
    it declares (see the module docstring). Malformed job names are skipped with a warning."""
    raw = extra_field(extra, "jobs")
    items: Iterable[tuple[Any, Any]]
    if isinstance(raw, str):
        items = ((name.strip(), None) for name in raw.split(",") if name.strip())
    elif isinstance(raw, Mapping):
        items = raw.items()
    elif isinstance(raw, (list, tuple)):
        items = ((name, None) for name in raw)
    else:
        return {}
    jobs: dict[str, DeclaredJob] = {}
    for name, spec in items:
        try:
            job = validate_job_name(str(name))
        except ConfigError as exc:
            log.warning("ignoring a job listed by a sparkpoint connection: %s", exc)
            continue
        dags = spec.get("dags", ()) if isinstance(spec, Mapping) else ()
        jobs[job] = DeclaredJob(
            dags=tuple(str(d) for d in (dags if isinstance(dags, (list, tuple)) else [dags]) if d),
            sink_spec=spec.get("sink") if isinstance(spec, Mapping) else None)
    return jobs


def scrub(text: str, secrets: Iterable[Any]) -> str:
    """`text` without `secrets` and every secret this process registered, nor any
    ``user:password@`` (`storage.redact.scrub`, the one scrubber)."""
    return stores.scrub(text, secrets)


def _aws_credentials(aws_connection: Any) -> dict[str, Any]:
    """Credentials (and endpoint/region) of an ``aws`` connection, through AwsBaseHook.

    :raises ConfigError: the Amazon provider is not installed.
    """
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError:
        raise ConfigError(
            f"aws_conn_id={aws_connection.conn_id!r} needs the Amazon provider to read its credentials: "
            "pip install 'airflow-sparkpoint[amazon]' (apache-airflow-providers-amazon); or leave "
            "aws_conn_id empty to use boto3's default credential chain"
        ) from None

    class _Hook(AwsBaseHook):
        # The connection was already read (asynchronously, in the triggerer): reuse it.
        def get_connection(self, conn_id: str) -> Any:  # type: ignore[override]
            return aws_connection

    hook = _Hook(aws_conn_id=aws_connection.conn_id, client_type="s3")
    credentials = hook.get_credentials()
    options: dict[str, Any] = {
        "aws_access_key_id": credentials.access_key,
        "aws_secret_access_key": credentials.secret_key,
    }
    if credentials.token:
        options["aws_session_token"] = credentials.token
    return {**options, **s3_options(hook.conn_config.endpoint_url, hook.conn_config.region_name)}


def _mask(*secrets: Any) -> None:
    """Keep `secrets` out of every message of this process (`storage.redact.register`: a
    hook made later to scrub an error knows the credentials an ``aws`` connection yielded
    here) and out of Airflow's task logs (its secrets masker)."""
    stores.register(*secrets)
    try:
        from airflow.sdk.log import mask_secret
    except ImportError:  # pragma: no cover - an Airflow without the task SDK's masker
        return
    for secret in secrets:
        if secret:
            mask_secret(str(secret))


class SparkpointHook(BaseHook):
    """Storage access and catalogs for Sparkpoint jobs.

    :param sparkpoint_conn_id: a connection of type ``sparkpoint``; or None with `storage_uri`.
    :param storage_uri: a storage root given directly (no connection needed for local paths).
    """

    conn_name_attr = "sparkpoint_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "sparkpoint"
    hook_name = "Sparkpoint"

    def __init__(self, sparkpoint_conn_id: str | None = default_conn_name,
                 storage_uri: str | None = None) -> None:
        super().__init__()
        self.sparkpoint_conn_id = sparkpoint_conn_id
        self._storage_uri = storage_uri
        self._resolved: tuple[str, dict[str, Any], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ the connection form

    @classmethod
    def get_ui_field_behaviour(cls) -> dict[str, Any]:
        """The form's layout (Airflow < 3.2; later releases read the provider info)."""
        return {key.replace("-", "_"): dict(value) if isinstance(value, dict) else list(value)
                for key, value in UI_FIELD_BEHAVIOUR.items()}

    @classmethod
    def get_connection_form_widgets(cls) -> dict[str, Any]:
        """The form's own fields (Airflow < 3.2; later releases read ``conn-fields``)."""
        from flask_appbuilder.fieldwidgets import BS3TextFieldWidget
        from flask_babel import lazy_gettext
        from wtforms import StringField
        from wtforms.validators import Optional

        return {
            name: StringField(lazy_gettext(spec["label"]), widget=BS3TextFieldWidget(),
                              description=spec["description"], validators=[Optional()])
            for name, spec in CONN_FIELDS.items()
        }

    # ------------------------------------------------------------------ resolving

    def _build(self, conn: Any, aws_conn: Any) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(storage URI, storage options, the connection's other fields) from connections
        already read; blocking (an AWS role may be assumed)."""
        options: dict[str, Any] = {}
        fields: dict[str, Any] = {}
        uri = self._storage_uri
        if conn is not None:
            extra = conn.extra_dejson or {}
            uri = uri or (conn.host or "").strip() or extra_field(extra, "storage_uri")
            if aws_conn is not None:
                options.update(_aws_credentials(aws_conn))
            endpoint_from = (f"aws connection {aws_conn.conn_id!r} endpoint_url" if aws_conn is not None
                             else "")
            own = s3_options(extra_field(extra, ENDPOINT_URL), extra_field(extra, REGION_NAME))
            if own:
                endpoint_from = f"Sparkpoint connection {conn.conn_id!r} extra endpoint_url"
            options.update(own)  # the connection's own values win
            if options.get(ENDPOINT_URL):
                options[ENDPOINT_URL] = validate_endpoint_url(str(options[ENDPOINT_URL]), endpoint_from)
            if conn.login and conn.password:
                options["aws_access_key_id"] = conn.login
                options["aws_secret_access_key"] = conn.password
                options.pop("aws_session_token", None)
            fields["jobs"] = declared_jobs(extra)
            fields["pyspark_python"] = extra_field(extra, "pyspark_python")
        _mask(*(options.get(name) for name in _CREDENTIAL_OPTIONS), *stores.userinfo(uri))
        if not uri:
            raise ConfigError(
                f"Sparkpoint connection {self.sparkpoint_conn_id!r} has no storage URI in its host field "
                "(expected e.g. s3://bucket/prefix), and no storage_uri was given"
            )
        if "://" not in str(uri) and not os.path.isabs(str(uri)):
            # Each process would resolve it against its own working directory (a task's is
            # a temporary one): a retry on another worker, the UI or a sensor would not find it.
            given = (f"Sparkpoint connection {self.sparkpoint_conn_id!r}: its storage root"
                     if uri != self._storage_uri else "storage root")
            raise ConfigError(
                f"{given} {str(uri)!r} (checkpoint_dir, storage_uri or the connection's "
                "host) is a relative path, "
                "which each process would resolve against its own working directory; "
                "expected an absolute path, "
                "file:///absolute/path or s3://bucket/prefix"
            )
        return str(uri), options, fields

    def _aws_conn_id(self, conn: Any) -> str | None:
        if conn is None or (conn.login and conn.password):
            return None
        value = extra_field(conn.extra_dejson or {}, "aws_conn_id")
        return None if value is None else str(value)

    def _resolve(self) -> tuple[str, dict[str, Any], dict[str, Any]]:
        if self._resolved is None:
            conn = self.get_connection(self.sparkpoint_conn_id) if self.sparkpoint_conn_id else None
            aws_conn_id = self._aws_conn_id(conn)
            aws_conn = self.get_connection(aws_conn_id) if aws_conn_id else None
            self._resolved = self._build(conn, aws_conn)
        return self._resolved

    async def aresolve(self) -> None:
        """Read the connection(s) with Airflow's async API (for triggers); the blocking
        rest (assuming an AWS role) runs in a worker thread."""
        if self._resolved is not None:
            return
        conn = await self.aget_connection(self.sparkpoint_conn_id) if self.sparkpoint_conn_id else None
        aws_conn_id = self._aws_conn_id(conn)
        aws_conn = await self.aget_connection(aws_conn_id) if aws_conn_id else None
        self._resolved = await asyncio.to_thread(self._build, conn, aws_conn)

    @property
    def storage_uri(self) -> str:
        return self._resolve()[0]

    @property
    def storage_options(self) -> dict[str, Any]:
        """Options for `open_storage` and sinks (may hold credentials: never log them)."""
        return dict(self._resolve()[1])

    @property
    def jobs(self) -> list[str]:
        """The connection's ``jobs`` field (empty without a connection)."""
        return list(self._resolve()[2].get("jobs") or [])

    def declared_sink(self, job_name: str) -> Sink | None:
        """The sink the connection's ``jobs`` field declares for `job_name` (None: no
        connection, the job is not listed, or it declares no sink).

        :raises ConfigError: the declaration is not a sink; the message names the
            connection and the job.
        """
        job = (self._resolve()[2].get("jobs") or {}).get(job_name)
        if job is None:
            return None
        try:
            return job.sink()
        except ConfigError as exc:
            raise ConfigError(f"Sparkpoint connection {self.sparkpoint_conn_id!r}, "
                              f"extra jobs.{job_name}.sink: "
                              f"{exc}") from None

    @property
    def pyspark_python(self) -> str | None:
        """The connection's ``pyspark_python`` field, or None."""
        value = self._resolve()[2].get("pyspark_python")
        return None if value is None else str(value)

    def get_storage(self) -> Storage:
        uri, options, _ = self._resolve()
        return open_storage(uri, **options)

    def get_catalog(self, job_name: str) -> Catalog:
        return Catalog(self.get_storage(), job_name)

    def pending_transactions(self, job_name: str, *,
                             generation: int | None = None) -> list[TransactionRecord]:
        """Staged, not yet committed transactions of job `job_name` (of one `generation`),
        in batch order (`services.sinks.pending_transactions`)."""
        return sinks.pending_transactions(self.get_catalog(job_name), generation=generation)

    def staged_rows(self, job_name: str, *, generation: int | None = None) -> list[dict[str, Any]]:
        """The rows of job `job_name`'s staged, not yet committed output (of one
        `generation`), in batch order: what a write-audit-publish audit checks. Read
        through the sink with this connection's storage options, so it works on S3 too
        (`services.sinks.staged_rows`).

        :raises ConfigError: a transaction's sink cannot show its staged rows (only
            ``DeltaSink`` output can be read before it is committed).
        """
        return sinks.staged_rows(self.get_catalog(job_name), self.storage_options, generation=generation)

    def delta_rows(self, table_uri: str, columns: list[str] | None = None) -> list[dict[str, Any]]:
        """The rows readers see now in the Delta table at `table_uri` (a path or
        ``s3://``, with this connection's endpoint and credentials); [] with no table
        (`services.sinks.delta_rows`)."""
        return sinks.delta_rows(table_uri, self.storage_options, columns)

    def location_url(self, job_name: str) -> str:
        """A URL of job `job_name`'s storage location, for a link: the AWS console for
        AWS S3, the endpoint's path-style URL for other S3 stores, ``file://`` for paths."""
        uri, options, _ = self._resolve()
        scheme, bucket, prefix = split_uri(uri)
        key = "/".join(p for p in (prefix.strip("/"), job_name) if p) + "/"
        if scheme == "s3":
            endpoint = options.get("endpoint_url")
            if endpoint:
                return f"{str(endpoint).rstrip('/')}/{bucket}/{quote(key)}"
            return f"https://s3.console.aws.amazon.com/s3/buckets/{bucket}?prefix={quote(key)}"
        return self.get_catalog(job_name).uri

    def secrets(self) -> list[str]:
        """What must never appear in a message: the connections' login, password and
        credentials, every extra value but the plain form fields, and the ``user:password``
        of the host and endpoint URLs. Read without resolving (which may be what failed)."""
        found: list[Any] = []
        conns = []
        try:
            conns.append(self.get_connection(self.sparkpoint_conn_id) if self.sparkpoint_conn_id else None)
            aws_conn_id = self._aws_conn_id(conns[0])
            conns.append(self.get_connection(aws_conn_id) if aws_conn_id else None)
        except Exception as exc:  # noqa: BLE001 - what could be read is scrubbed
            log.debug("scrubbing without a connection: %s", type(exc).__name__)
        for conn in conns:
            if conn is None:
                continue
            extra = conn.extra_dejson if isinstance(conn.extra_dejson, dict) else {}
            found += [conn.login, conn.password, *stores.userinfo(conn.host)]
            found += [part for name in ("endpoint_url", "storage_uri")
                      for part in stores.userinfo(extra_field(extra, name))]
            plain = [k for k in extra if k in _PLAIN_EXTRA or k.rpartition("__")[2] in _PLAIN_EXTRA]
            found += stores.secret_values(extra, plain)
        if self._resolved is not None:
            found += [self._resolved[1].get(name) for name in _CREDENTIAL_OPTIONS]
        found += stores.userinfo(self._storage_uri)
        return [str(s) for s in found if s]

    def scrub(self, text: str) -> str:
        """`text` without this hook's `secrets`, those this process registered (the
        credentials an ``aws`` connection yielded to any hook), nor any ``user:password@``."""
        return stores.scrub(text, self.secrets())

    def scrub_value(self, value: Any) -> Any:
        """`value` (an XCom value, an event) with every string in it scrubbed (`scrub`)."""
        return stores.scrub_value(value, self.secrets())

    def test_connection(self) -> tuple[bool, str]:
        """Whether the storage root can be listed, with a message for the connection form
        (scrubbed: the form shows it to whoever clicks *Test*)."""
        try:
            storage = self.get_storage()
            storage.check()
        except Exception as exc:  # noqa: BLE001 - reported to the UI
            return False, self.scrub(f"Sparkpoint connection {self.sparkpoint_conn_id!r} "
                                     "cannot reach its storage: "
                                     f"{type(exc).__name__}: {exc}")
        return True, self.scrub(f"Sparkpoint storage {self.storage_uri} is reachable")
