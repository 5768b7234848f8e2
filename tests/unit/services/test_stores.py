"""Which directories under a storage root are jobs (`services.stores`): one rule for the
CLI's hint of other jobs and the UI's stored jobs (issue #47)."""

from __future__ import annotations

from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.services.stores import other_jobs


def _root_with(catalog: Catalog, *names: str) -> None:
    for name in names:
        catalog.storage.put(f"{name}/status.json", b"{}")


def test_other_jobs_names_only_directories_with_a_job_name(catalog: Catalog) -> None:
    """A scratch directory, a dot directory or a name no job can have is no job, for the
    CLI's hint as for the UI's list (`plugins.pipelines.stored_jobs`)."""
    _root_with(catalog, "orders", "clicks", "_scratch", ".trash", "a b", "x..y", "z-9")
    assert other_jobs(catalog) == ["clicks", "z-9"]
