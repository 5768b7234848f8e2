"""The real sinks the chaos and race tests run their jobs into: where each one writes,
how it is read back, what a transaction that lost would leave behind, and how far a
killed promotion got.

A case is one sink in one place: ``delta-merge``, ``delta-append``, ``directory``
locally; ``s3``, ``directory-s3``, ``delta-s3`` on an S3 server; ``catalog-s3`` puts
the storage root (checkpoints, records, status) on the server too, with an S3Sink
output. Its `kind` is the sink as the race job's ``--sink`` argument names it (and the
chaos job that writes it, `tests.chaos.cases.job_script`).
"""

from __future__ import annotations

import os
import urllib.parse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.support.s3_servers import S3Context
from tests.support.sink_files import json_rows, visible, visible_rows

if TYPE_CHECKING:
    from airflow_sparkpoint.checkpoints import Catalog

__all__ = [
    "CatalogS3Case",
    "DeltaAppendCase",
    "DeltaCase",
    "DeltaMergeCase",
    "DeltaS3Case",
    "DirectoryCase",
    "DirectoryS3Case",
    "S3Case",
    "SinkCase",
]


class SinkCase:
    """One sink of a test's job under `root` (or on `s3`'s bucket): its output, its
    storage root, read back and checked for leftovers."""

    name = ""
    kind = ""
    merge = False
    on_s3 = False  # the output is on the S3 server
    catalog_on_s3 = False  # the storage root is on the S3 server
    delta = False
    #: a kill at ``promoting`` leaves some files of the batch promoted and some not
    file_by_file = True
    #: the output's folder: under `root`, or on S3 under the case's own prefix
    folder = "output"

    def __init__(self, root: Path, s3: S3Context | None = None) -> None:
        self.root = root
        self.s3 = s3
        if self.uses_s3:
            assert s3 is not None, f"the {self.name} case needs an S3 server"
        self.prefix = f"{root.name}-{uuid.uuid4().hex[:6]}"

    @property
    def key(self) -> str:
        """The case as counted: ``<name>`` or ``<name>@<server>``."""
        return f"{self.name}@{self.s3.server}" if self.s3 is not None and self.uses_s3 else self.name

    @property
    def uses_s3(self) -> bool:
        return self.on_s3 or self.catalog_on_s3

    @property
    def out_prefix(self) -> str:
        """The output's key prefix on S3 (``<prefix>/<folder>/``)."""
        return f"{self.prefix}/{self.folder}/"

    def output(self) -> str:
        if self.on_s3:
            assert self.s3 is not None
            return f"s3://{self.s3.bucket}/{self.out_prefix.rstrip('/')}"
        return str(self.root / self.folder)

    def checkpoint_root(self) -> str:
        if self.catalog_on_s3:
            assert self.s3 is not None
            return f"s3://{self.s3.bucket}/{self.prefix}/checkpoints"
        return str(self.root / "checkpoints")

    def conf(self, job: str) -> dict[str, str]:
        """`job`'s settings for this case: its storage root, the S3 endpoint, the work dir."""
        conf = {"spark.sparkpoint.dir": self.checkpoint_root(), "spark.sparkpoint.job": job}
        if self.uses_s3:
            assert self.s3 is not None
            conf.update(self.s3.conf())
        if self.catalog_on_s3:
            conf["spark.sparkpoint.workDir"] = str(self.root / "work")
        return conf

    def storage_options(self) -> dict[str, Any]:
        """Connection options of the catalog and the commit step (same endpoint as `conf`)."""
        return self.s3.options() if self.uses_s3 and self.s3 is not None else {}

    def catalog(self, job: str) -> Catalog:
        from airflow_sparkpoint.checkpoints import Catalog

        return Catalog.open(self.checkpoint_root(), job, **self.storage_options())

    def sink(self) -> Any:
        """The sink object, configured, for reading its claims from the test."""
        from airflow_sparkpoint.sinks import DeltaSink, DirectorySink, S3Sink

        sink: Any
        if self.delta:
            sink = DeltaSink(self.output(), mode="merge" if self.merge else "append",
                             keys=["user"] if self.merge else None)
        elif self.kind == "s3":
            sink = S3Sink(self.output(), format="json")
        else:
            sink = DirectorySink(self.output(), format="json")
        if self.on_s3:
            sink.configure(self.storage_options())
        return sink

    def rows(self) -> list[dict[str, Any]]:
        """What a reader of the output sees."""
        raise NotImplementedError

    def leftovers(self, job: str) -> list[str]:
        """Staged data that should not exist after a successful run: `job`'s where the
        sink stages per job (Delta), otherwise any job's."""
        raise NotImplementedError

    def promotion(self, record: Any) -> tuple[int, int]:
        """(files of `record`'s batch already promoted, files of the batch)."""
        raise NotImplementedError

    def describe_promotion(self, record: Any) -> str:
        promoted, total = self.promotion(record)
        return f"{promoted} of the {total} files of batch {record.batch_id} promoted when killed"

    def partial_promotion(self, record: Any) -> str | None:
        """None when a kill at ``promoting`` left batch `record` really half promoted;
        otherwise what is wrong (a message)."""
        promoted, total = self.promotion(record)
        if total < 3:
            return f"batch {record.batch_id} has {total} file(s); the trial needs at least 3"
        if not 0 < promoted < total:
            return (f"{promoted} of the {total} files of batch {record.batch_id} were promoted: "
                    "not a partial promotion")
        return None


# ---------------------------------------------------------------------------- Delta


class DeltaCase(SinkCase):
    delta = True
    #: Delta's promotion is one log entry, atomic: "half done" is the entry written while
    #: the committer never learnt it (the record and staging are still there)
    file_by_file = False

    def delta_options(self) -> dict[str, str] | None:
        return None

    def _table(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.output(), storage_options=self.delta_options())
        except TableNotFoundError:
            return None

    def rows(self) -> list[dict[str, Any]]:
        table = self._table()
        return [] if table is None else list(table.to_pyarrow_table().to_pylist())

    def _staged_dirs(self, job: str) -> set[str]:
        staging = Path(self.output()) / "_sparkpoint_txn" / job
        return set(os.listdir(staging)) if staging.exists() else set()

    def _referenced(self, job: str) -> set[str]:
        import pyarrow as pa

        table = self._table()
        if table is None:
            return set()
        prefix = f"_sparkpoint_txn/{job}/"
        found = set()
        for path in pa.table(table.get_add_actions(flatten=True)).column("path").to_pylist():
            path = urllib.parse.unquote(path)
            if path.startswith(prefix):
                found.add(path[len(prefix):].split("/", 1)[0])
        return found

    def leftovers(self, job: str) -> list[str]:
        return [f"_sparkpoint_txn/{job}/{name}"
                for name in sorted(self._staged_dirs(job) - self._referenced(job))]

    def promotion(self, record: Any) -> tuple[int, int]:
        table = self._table()
        files = record.payload["staged"]["files"]
        version = table.transaction_version(record.job) if table is not None else None
        landed = version is not None and version >= record.batch_id  # version 0 is batch 0 committed
        return (len(files) if landed else 0), len(files)

    def describe_promotion(self, record: Any) -> str:
        _promoted, total = self.promotion(record)
        return (f"the Delta log entry of batch {record.batch_id} ({total} staged file(s)) landed; its record "
                "and staging were still there when killed")

    def partial_promotion(self, record: Any) -> str | None:
        promoted, total = self.promotion(record)
        if not promoted:
            return (f"the Delta log has no commit of batch {record.batch_id}: the kill came "
                    "before the promotion")
        staging = record.payload["staged"]["staging"].rsplit("/", 1)[-1]
        if staging not in self._staged_dirs(record.job):
            return f"the staging of batch {record.batch_id} is gone: the kill came after the commit returned"
        if not self.merge and total < 3:
            return f"batch {record.batch_id} has {total} staged file(s); the trial needs at least 3"
        return None


class DeltaMergeCase(DeltaCase):
    name = kind = "delta-merge"
    merge = True


class DeltaAppendCase(DeltaCase):
    name = kind = "delta-append"


class DeltaS3Case(DeltaMergeCase):
    """The merge job into a Delta table on S3: staged objects uploaded with boto3, the
    commit a delta-rs log entry created with a conditional put."""

    name = "delta-s3"
    on_s3 = True
    folder = "table"

    def delta_options(self) -> dict[str, str] | None:
        assert self.s3 is not None
        return {"AWS_ENDPOINT_URL": self.s3.endpoint, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true",
                "AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"],
                "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}

    def _staged_dirs(self, job: str) -> set[str]:
        assert self.s3 is not None
        staging = f"{self.out_prefix}_sparkpoint_txn/{job}/"
        return {key[len(staging):].split("/", 1)[0] for key in _keys(self.s3, staging)}


# ---------------------------------------------------------------------------- S3 and directories


def _keys(s3: S3Context, prefix: str) -> list[str]:
    pages = s3.client().get_paginator("list_objects_v2").paginate(Bucket=s3.bucket, Prefix=prefix)
    return [item["Key"] for page in pages for item in page.get("Contents", ())]


def _visible_s3_rows(s3: S3Context, prefix: str) -> list[dict[str, Any]]:
    """The rows of every object under `prefix` that a reader sees (`visible`), in key order."""
    client = s3.client()
    return json_rows([client.get_object(Bucket=s3.bucket, Key=k)["Body"].read().decode()
                      for k in _keys(s3, prefix) if visible(k[len(prefix):])])


def _exists(s3: S3Context, key: str) -> bool:
    from botocore.exceptions import ClientError

    try:
        s3.client().head_object(Bucket=s3.bucket, Key=key)
        return True
    except ClientError:
        return False


class S3Case(SinkCase):
    name = kind = "s3"
    on_s3 = True
    folder = "out"

    def rows(self) -> list[dict[str, Any]]:
        assert self.s3 is not None
        return _visible_s3_rows(self.s3, self.out_prefix)

    def _pending(self) -> list[tuple[str, str]]:
        assert self.s3 is not None
        pages = self.s3.client().get_paginator("list_multipart_uploads").paginate(
            Bucket=self.s3.bucket, Prefix=self.out_prefix)
        return [(u["Key"], u["UploadId"]) for p in pages for u in p.get("Uploads", ())]

    def leftovers(self, job: str) -> list[str]:
        return [f"pending upload {key}" for key, _upload in self._pending()]

    def promotion(self, record: Any) -> tuple[int, int]:
        assert self.s3 is not None
        uploads = record.payload["staged"]["uploads"]
        pending = {key for key, _upload in self._pending()}
        completed = [u for u in uploads if u["key"] not in pending and _exists(self.s3, u["key"])]
        return len(completed), len(uploads)


class CatalogS3Case(S3Case):
    """Everything remote: the storage root (checkpoints, records, status, control) and the
    S3Sink output on the same server; Spark's live checkpoint on local disk."""

    name = "catalog-s3"
    catalog_on_s3 = True


class DirectoryCase(SinkCase):
    name = kind = "directory"

    def _final(self, record: Any) -> list[tuple[str, str]]:
        """(staged path, final path) of each file of `record`, relative to the sink root."""
        from airflow_sparkpoint.sinks.directory import DirectorySink

        staged = record.payload["staged"]
        return [(f"{staged['staging']}/{f['path']}", DirectorySink._final_path(record.txn_id, i, f["path"]))
                for i, f in enumerate(staged["files"])]

    def rows(self) -> list[dict[str, Any]]:
        return visible_rows(Path(self.output()))

    def leftovers(self, job: str) -> list[str]:
        staging = Path(self.output()) / "_staging"
        if not staging.exists():
            return []
        return [f"_staging/{p.relative_to(staging)}" for p in sorted(staging.rglob("*"))]

    def promotion(self, record: Any) -> tuple[int, int]:
        moves = self._final(record)
        return sum(1 for _src, dst in moves if (Path(self.output()) / dst).is_file()), len(moves)


class DirectoryS3Case(DirectoryCase):
    """DirectorySink on S3: staged objects, promoted by server-side copy."""

    name = "directory-s3"
    on_s3 = True
    folder = "dir"

    def rows(self) -> list[dict[str, Any]]:
        assert self.s3 is not None
        return _visible_s3_rows(self.s3, self.out_prefix)

    def leftovers(self, job: str) -> list[str]:
        assert self.s3 is not None
        return _keys(self.s3, self.out_prefix + "_staging/")

    def promotion(self, record: Any) -> tuple[int, int]:
        assert self.s3 is not None
        moves = self._final(record)
        return sum(1 for _src, dst in moves if _exists(self.s3, self.out_prefix + dst)), len(moves)
