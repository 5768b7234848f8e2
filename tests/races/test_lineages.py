"""Lineages (invariant 9), issue #15 hole 2: a rewind, then a crash before the first new
checkpoint, must not lose the rewound batches.

A Delta append job processes 8 batches (3 checkpoints retained). A run restores the
oldest retained checkpoint with ``restore.sinkAhead=rewind`` and is SIGKILLed right after
the table's RESTORE. The retry, with default settings (``restore=latest``), must continue
the rewound lineage: restore that same checkpoint, run the rewound batches again, and
leave every row exactly once. Restoring the abandoned lineage's newest checkpoint instead
would process nothing and lose the rewound batches' rows.

``slow``: the same window held open instead of killed: the rewinding driver is held after
the rewind while a second driver with default settings starts (and must continue the
rewound lineage, fencing the first one out).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.race_drivers import (
    FIRST_RUN_BATCHES,
    args,
    delta_version,
    diff,
    expected_rows,
    first_run,
    job_conf,
    table_rows,
)

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

def _restored(table: Path) -> bool:
    from deltalake import DeltaTable

    return any(entry.get("operation") == "RESTORE" for entry in DeltaTable(str(table)).history())


def test_a_retry_after_a_crash_right_after_a_rewind_continues_the_rewound_lineage(
    tmp_path: Path, start_driver: Any
) -> None:
    catalog, oldest = first_run(tmp_path, start_driver)
    root, table = tmp_path / "checkpoints", tmp_path / "table"
    rewind = job_conf(root, {"restore": catalog.checkpoint_uri(oldest.id), "restore.sinkAhead": "rewind"})
    crashed = start_driver("rewind", rewind, args(tmp_path), fault=f"rewind:{oldest.batch_id}")
    assert crashed.wait() != 0
    assert crashed.fault_marker.read_text().strip() == f"rewind:{oldest.batch_id}", crashed.tail()
    assert _restored(table) and delta_version(table) == oldest.batch_id, "the table was rewound"

    retry = start_driver("retry", job_conf(root), args(tmp_path))
    assert retry.wait() == 0, retry.tail()

    result = retry.result
    assert result is not None
    assert result["restored_from"] == catalog.checkpoint_uri(oldest.id), \
        "the retry must continue the rewound lineage"
    assert result["first_batch"] == oldest.batch_id + 1 and result["last_batch"] == FIRST_RUN_BATCHES - 1
    problems = diff(expected_rows(tmp_path / "input"), table_rows(table))
    assert not problems, problems
    entries = catalog.list_checkpoints()
    assert all(e.superseded_by is None for e in entries), "retention removed the abandoned lineage"
    assert catalog.latest() is not None and catalog.latest().generation == result["generation"]


@pytest.mark.slow
def test_a_driver_started_while_another_is_held_after_its_rewind_continues_the_rewound_lineage(
    tmp_path: Path, start_driver: Any
) -> None:
    catalog, oldest = first_run(tmp_path, start_driver)
    root, table = tmp_path / "checkpoints", tmp_path / "table"
    rewind = job_conf(root, {"restore": catalog.checkpoint_uri(oldest.id), "restore.sinkAhead": "rewind"})
    held = start_driver("rewind", rewind, args(tmp_path), pause="after_rewind")
    assert held.reached("after_rewind")["batch"] == oldest.batch_id
    assert _restored(table)

    other = start_driver("other", job_conf(root), args(tmp_path))
    assert other.wait() == 0, other.tail()
    result = other.result
    assert result is not None and result["restored_from"] == catalog.checkpoint_uri(oldest.id)
    problems = diff(expected_rows(tmp_path / "input"), table_rows(table))
    assert not problems, f"after the second driver finished: {problems}"

    held.release("after_rewind")
    assert held.wait() != 0 and "StaleGeneration" in held.output, held.tail()
    problems = diff(expected_rows(tmp_path / "input"), table_rows(table))
    assert not problems, problems
