"""The sinks under chaos (`tests.support.sink_cases`): the ones a trial can run, counted
per S3 server, and the chaos job that writes each.

A case key is the case's name (``delta-merge``, ``delta-append``, ``directory``) or, for
a case on S3, the name and the server (``s3@moto``, ``delta-s3@seaweedfs``, ...):
coverage is counted per server.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.s3_servers import SERVERS
from tests.support.sink_cases import (
    CatalogS3Case,
    DeltaAppendCase,
    DeltaMergeCase,
    DeltaS3Case,
    DirectoryCase,
    DirectoryS3Case,
    S3Case,
    SinkCase,
)

JOB = "chaos"
JOBS = Path(__file__).resolve().parent / "jobs"

CASES: dict[str, type[SinkCase]] = {
    c.name: c for c in (DeltaMergeCase, DeltaAppendCase, DeltaS3Case, S3Case, DirectoryCase, DirectoryS3Case,
                        CatalogS3Case)
}


#: the chaos job that writes each sink kind
SCRIPTS = {"delta-merge": "delta_merge_job.py", "delta-append": "delta_append_job.py", "s3": "s3_job.py",
           "directory": "directory_job.py"}


def job_script(case: SinkCase) -> Path:
    """The chaos job that writes `case`'s sink."""
    return JOBS / SCRIPTS[case.kind]


def case_keys() -> tuple[str, ...]:
    """Every case as counted: local sinks once, S3 ones once per server."""
    keys: list[str] = []
    for name, case in CASES.items():
        if case.on_s3 or case.catalog_on_s3:
            keys += [f"{name}@{server}" for server in SERVERS]
        else:
            keys.append(name)
    return tuple(keys)


def split_key(key: str) -> tuple[type[SinkCase], str | None]:
    """(the case class, the S3 server or None) of a case key."""
    name, _, server = key.partition("@")
    return CASES[name], server or None
