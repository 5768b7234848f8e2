"""docs/tutorial.md runs as written: every fenced block of the page carries a marker
(``<!-- docs-test: run -->`` for a bash block to run, ``<!-- docs-test: file PATH -->`` for a
file to write), and the blocks are turned, in page order, into one bash script that runs
in a fresh temporary directory (exports carry from one step to the next, as in a reader's
shell). The run ends with ``sparkpoint status --json``, which must show the first
checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.docs_blocks import tutorial_script
from tests.support.paths import REPO

TUTORIAL = REPO / "docs" / "tutorial.md"


def test_every_block_of_the_tutorial_is_marked_and_becomes_one_script() -> None:
    script = tutorial_script(TUTORIAL.read_text())
    # the steps the test below relies on are there, in order
    order = [script.index(s) for s in ("cat > dags/jobs/orders_totals.py", "cat > dags/first_pipeline.py",
                                       "airflow dags test first_pipeline", "sparkpoint status")]
    assert order == sorted(order), order


@pytest.mark.spark
@pytest.mark.airflow
def test_the_tutorial_runs_to_the_first_checkpoint(tmp_path: Path) -> None:
    script = tutorial_script(TUTORIAL.read_text())
    (tmp_path / "tutorial.sh").write_text(script)
    bindir = str(Path(sys.executable).parent)  # the reader's activated environment
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "SPARKPOINT_", "PYSPARK_"))}
    env.update({"PATH": bindir + os.pathsep + env.get("PATH", os.defpath), "HOME": str(tmp_path)})
    env.pop("SPARK_HOME", None)
    done = subprocess.run(["bash", "tutorial.sh"], check=False, cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, f"stdout:\n{done.stdout[-4000:]}\nstderr:\n{done.stderr[-4000:]}"

    status = json.loads((tmp_path / "status.json").read_text())
    assert status["job"] == "orders"
    assert status["generation"] == 1 and status["state"] == "finished", status
    first = status["latest_checkpoint"]
    assert first is not None, status
    assert first["generation"] == 1 and first["batch_id"] == 1, first  # two input files: batches 0 and 1
    assert first["uri"].startswith(f"file://{tmp_path}/checkpoints/orders/chk-"), first
    assert status["counts"]["completed"] >= 1, status
    result_lines = [line for line in done.stdout.splitlines() if line.startswith("SPARKPOINT_RESULT ")]
    assert result_lines, done.stdout
    result, _ = json.JSONDecoder().raw_decode(result_lines[-1].removeprefix("SPARKPOINT_RESULT "))
    assert (result["status"], result["first_batch"], result["last_batch"]) == ("finished", 0, 1), result
