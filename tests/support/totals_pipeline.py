"""The data side of the end-to-end tests (and of the integration test of the deferred
submit, which runs the same job on the same Airflow stack): one pipeline's input files,
the oracle computed from them in plain Python, and what its Delta table shows."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.commit_head import read_commit_head
from airflow_sparkpoint.demo.support import delta_commits, delta_rows, orphaned_staged_files, write_batch_file
from airflow_sparkpoint.storage import open_storage
from tests.support.inputs import expected_totals
from tests.support.paths import REPO

E2E_DAGS = REPO / "tests" / "e2e" / "dags"
E2E_JOB = E2E_DAGS / "jobs" / "e2e_totals.py"
FAKES = REPO / "tests" / "e2e" / "fakes"
EXAMPLE_JOBS = REPO / "dags" / "jobs"


class Totals:
    """Per-user running totals: JSON input files (one a micro-batch), a Delta table
    merged by user, and a Sparkpoint root, all under `base`; the job name is unique."""

    def __init__(self, base: Path, name: str, root: Path | None = None) -> None:
        self.base = base
        self.job = f"{name}_{uuid.uuid4().hex[:6]}"
        self.input = base / "input"
        self.output = base / "output"
        self.root = root or base / "checkpoints"
        self.pauses = base / "pauses"
        self.input.mkdir(parents=True, exist_ok=True)
        self.pauses.mkdir()
        self.files: list[list[dict[str, Any]]] = []

    # ------------------------------------------------------------------ input and oracle

    def write(self, rows: Iterable[tuple[str, int]]) -> int:
        """Write the next input file (one micro-batch with ``files_per_batch=1``); returns its index."""
        index = len(self.files)
        batch = [{"user": user, "amount": amount} for user, amount in rows]
        write_batch_file(self.input, index, batch)
        self.files.append(batch)
        return index

    def write_many(self, count: int, users: int = 3) -> None:
        for _ in range(count):
            index = len(self.files)
            self.write((f"u{u}", index * 10 + u + 1) for u in range(users))

    def expected(self, files: int | None = None) -> dict[str, tuple[int, int]]:
        """(total, events) by user over the first `files` input files (default all)."""
        return expected_totals(row for rows in self.files[:files] for row in rows)

    # ------------------------------------------------------------------ output

    def table(self) -> dict[str, tuple[int, int]]:
        """What readers of the Delta table see, by user (no user twice)."""
        rows = delta_rows(self.output)
        got = {r["user"]: (int(r["total"]), int(r["events"])) for r in rows}
        assert len(got) == len(rows), f"a user appears twice in the table: {sorted(r['user'] for r in rows)}"
        return got

    def assert_exact(self) -> list[dict[str, Any]]:
        """The table equals the oracle row by row, every batch was committed once, and
        no staged output was left behind; returns the Sparkpoint commits."""
        got, want = self.table(), self.expected()
        for user in sorted(set(got) | set(want)):
            assert got.get(user) == want.get(user), (
                f"user {user}: table has {got.get(user)}, input says {want.get(user)}\n"
                f"table {got}\nexpected {want}")
        commits = delta_commits(self.output)
        batches = [c["batch"] for c in commits]
        assert len(batches) == len(set(batches)), f"a batch was committed twice: {commits}"
        assert orphaned_staged_files(self.output, self.job) == [], "staged output left behind"
        return commits

    @property
    def catalog(self) -> Catalog:
        return Catalog(open_storage(str(self.root)), self.job)

    def status(self) -> dict[str, Any]:
        return self.catalog.read_status() or {}

    def committed(self) -> int | None:
        """The newest batch the job's output holds (the commit head; None before the first
        commit). A batch commits after the checkpoint that confirms it: a checkpoint of
        batch N in the status does not yet mean N is in the table."""
        head = read_commit_head(self.catalog)
        return None if head is None else head.batch

    def params(self, **extra: Any) -> dict[str, Any]:
        """DAG run conf for the ``e2e_*`` submit DAGs."""
        return {"job_name": self.job, "input": str(self.input), "output": str(self.output),
                "checkpoint_dir": str(self.root), "pause_dir": str(self.pauses), **extra}

    # ------------------------------------------------------------------ pauses

    def reached(self, point: str) -> dict[str, Any] | None:
        path = self.pauses / f"{point}.reached"
        return dict(json.loads(path.read_text())) if path.exists() else None

    def release(self, point: str) -> None:
        self.pauses.mkdir(parents=True, exist_ok=True)
        (self.pauses / f"{point}.release").touch()


def running_with_checkpoint(pipeline: Totals, batch: int, after_generation: int = 0) -> int | None:
    """The generation, once a generation newer than `after_generation` is running with a
    completed checkpoint of `batch` or later."""
    status = pipeline.status()
    if status.get("state") != "running" or int(status.get("generation") or 0) <= after_generation:
        return None
    last = status.get("last_batch")
    if status.get("last_checkpoint_id") is None or last is None or int(last) < batch:
        return None
    return int(status["generation"])


def result_of(pipeline: Totals, generation: int) -> dict[str, Any] | None:
    """The run result a generation wrote at its end (None if it wrote none)."""
    from airflow_sparkpoint.checkpoints.run_result import read_run_result

    result = read_run_result(pipeline.catalog, generation)
    return None if result is None else result.to_json()


def since(t0: float) -> str:
    return f"{time.monotonic() - t0:.1f} s"


def subset(mapping: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: mapping.get(k) for k in keys}
