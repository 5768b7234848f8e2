"""Issue #27.3: a zombie's retention must not wedge the lineage it did not see.

After a first run (8 batches, checkpoints of batches 5, 6 and 7 retained), a driver
processes batch 8 and is held inside its retention pass, after its generation check and
before its deletions (pause point ``retention_delete``): it is the stale deleter. Then a
second driver restores the checkpoint of batch 5 by path with ``sinkAhead=rewind`` and
is held right after the rewind (``after_rewind``): a new lineage with no checkpoint of
its own. The first driver is released: its retention, decided before the new lineage
existed, deletes the checkpoint of batch 5, and its next act is fenced out. The second
driver dies (SIGKILL) before its first checkpoint. A retry with default settings
(``restore=latest``) must continue the rewound lineage and leave every row exactly once;
it must not stop with "no older checkpoint of that lineage is left".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import layout
from tests.support.race_drivers import (
    FIRST_RUN_BATCHES,
    args,
    delta_version,
    diff,
    expected_rows,
    first_run,
    job_conf,
    table_rows,
    write_inputs,
)

# slow: the default run is at its 40-minute budget; `make test-all` runs it
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]


def test_a_zombies_retention_cannot_wedge_the_lineage_restored_meanwhile(
    tmp_path: Path, start_driver: Any
) -> None:
    catalog, oldest = first_run(tmp_path, start_driver)
    root, table = tmp_path / "checkpoints", tmp_path / "table"
    write_inputs(tmp_path / "input", files=1, start=FIRST_RUN_BATCHES)

    zombie = start_driver("zombie", job_conf(root), args(tmp_path), pause="retention_delete")
    assert zombie.reached("retention_delete")["batch"] == FIRST_RUN_BATCHES
    rewind = job_conf(root, {"restore": catalog.checkpoint_uri(oldest.id), "restore.sinkAhead": "rewind"})
    restorer = start_driver("rewind", rewind, args(tmp_path), pause="after_rewind")
    held = restorer.reached("after_rewind")
    assert held["batch"] == oldest.batch_id
    assert delta_version(table) == oldest.batch_id, "the table was rewound"

    zombie.release("retention_delete")
    assert zombie.wait() != 0 and "StaleGeneration" in zombie.output, zombie.tail()
    assert not catalog.store.exists(layout.checkpoint_metadata(oldest.id)), \
        "the stale retention deleted the checkpoint the new lineage restored"
    restorer.stop()  # dies before its first checkpoint
    assert restorer.proc.returncode != 0

    retry = start_driver("retry", job_conf(root), args(tmp_path))
    assert retry.wait() == 0, retry.tail()
    result = retry.result
    assert result is not None
    assert result["restored_from"] == f"{catalog.uri}/{layout.pin_dir(int(held['generation']))}", \
        "the retry restarts from the copy the rewound lineage owns"
    assert result["first_batch"] == oldest.batch_id + 1 and result["last_batch"] == FIRST_RUN_BATCHES, result
    problems = diff(expected_rows(tmp_path / "input"), table_rows(table))
    assert not problems, problems
