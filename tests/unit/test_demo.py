"""The demo's pure parts: input plan and expected totals, tables, error gists, the
verdict, the progress watcher over a real local catalog, the console's log redirection,
and the Delta readers shared with the example-DAG tests (on a real delta-rs table)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.history import load_history, snapshot_records
from airflow_sparkpoint.checkpoints.metadata import SnapshotMetadata, SnapshotStats
from airflow_sparkpoint.checkpoints.run_result import RunResult, write_run_result
from airflow_sparkpoint.demo import (
    BLUE_AGAIN_INPUT,
    BLUE_BACKLOG,
    FAILING_GREEN_INPUT,
    HEALTHY_GREEN_INPUT,
    batch_of,
    expected_totals,
)
from airflow_sparkpoint.demo.console import Check, Console, Watcher, gist, verdict_lines
from airflow_sparkpoint.demo.record import (
    checkpoint_table,
    delta_history_table,
    format_table,
    generation_table,
    human_bytes,
    origin,
    short_name,
    summary_lines,
)
from airflow_sparkpoint.demo.support import (
    delta_commits,
    delta_history,
    orphaned_staged_files,
    write_batch_file,
)
from tests.support.records import put_checkpoint, write_status

# ---------------------------------------------------------------------------- input plan


def test_expected_totals_follow_the_demo_input_and_the_code_version_that_wrote_last() -> None:
    plan = [(users, 1) for users in [*BLUE_BACKLOG, *FAILING_GREEN_INPUT, *BLUE_AGAIN_INPUT]]
    plan += [(users, 2) for users in HEALTHY_GREEN_INPUT]
    totals = expected_totals(plan)
    # u0 is in files 0, 1, 5 and 7: amounts 0 + 10 + 50 + 70; file 7 is green's (version 2).
    assert totals["u0"] == (130, 4, 2)
    assert totals["u3"] == (23 + 33 + 43 + 83, 4, 2)
    assert expected_totals([(("u1", "u2"), 1), (("u2",), 2)]) == {"u1": (1, 1, 1), "u2": (2 + 12, 2, 2)}


def test_blue_reads_its_whole_backlog_in_batch_0_then_one_file_per_batch() -> None:
    assert [batch_of(i) for i in range(5)] == [0, 0, 1, 2, 3]


def test_write_batch_file_orders_files_by_mtime_and_leaves_no_temp_file(tmp_path: Path) -> None:
    for index in (1, 0, 2):
        write_batch_file(tmp_path, index, [{"user": "u1", "amount": index}])
    files = sorted(tmp_path.iterdir(), key=lambda p: p.stat().st_mtime)
    assert [p.name for p in files] == ["part-0000.json", "part-0001.json", "part-0002.json"]
    assert json.loads(files[2].read_text()) == {"user": "u1", "amount": 2}


# ---------------------------------------------------------------------------- formatting


def test_format_table_right_aligns_numbers_and_shows_none_as_a_dash() -> None:
    lines = format_table(["chk", "role", "ms"], [(3, "blue", 45), (12, "green", None)], indent="")
    assert lines == [
        "chk  role   ms",
        "---  -----  --",
        "  3  blue   45",
        " 12  green   -",
    ]


def test_format_table_refuses_a_row_with_the_wrong_number_of_cells() -> None:
    with pytest.raises(ValueError, match="has 1 cells; expected 2"):
        format_table(["a", "b"], [("x",)])


def test_human_bytes() -> None:
    assert [human_bytes(n) for n in (0, 1023, 1024, 1536, 5 * 1024**2)] == [
        "0 B", "1023 B", "1.0 KiB", "1.5 KiB", "5.0 MiB"]


def test_verdict_is_yes_only_when_every_check_passed() -> None:
    ok, lines = verdict_lines([Check("table exact", True), Check("nothing staged", True, "0 files")])
    assert ok and lines == ["   [ok] table exact", "   [ok] nothing staged: 0 files",
                            "   exactly-once over the whole demo: YES"]
    ok, lines = verdict_lines([Check("table exact", True), Check("each batch once", False, "batch 3 twice")])
    assert not ok and lines[1] == "   [FAILED] each batch once: batch 3 twice"
    assert lines[-1].endswith("exactly-once over the whole demo: NO")
    assert verdict_lines([])[0] is False, "no checks is no verdict"


def test_gist_of_a_failed_spark_submit_names_the_exit_code_and_the_driver_error() -> None:
    killed = ("Cannot execute: spark-submit --master local[2] --conf a=b job.py. Error code is: -9.\n"
              "Last spark-submit output:\nWARN something")
    assert gist(killed) == "spark-submit exited with -9 (SIGKILL)"
    raised = ("Cannot execute: spark-submit x.py. Error code is: 1.\nLast spark-submit output:\n"
              'File "keyed_totals.py", line 86, in stage\nraise RuntimeError(\n'
              "RuntimeError: keyed_totals v2: simulated failure in batch 2 "
              "(--fail-after-batch 1)\nSQLSTATE: 39000")
    assert gist(raised) == ("spark-submit exited with 1: RuntimeError: keyed_totals v2: simulated failure in "
                            "batch 2 (--fail-after-batch 1)")
    assert (gist("deploy rolled back (green failed); blue was restored from file:///tmp/w/bg/savepoints/"
                 "savepoint-1-ab12\nmore")
            == "deploy rolled back (green failed); blue was restored from savepoint-1-ab12")
    assert gist("x" * 200, limit=10) == "x" * 9 + "…"
    assert gist("") == ""


def test_snapshot_names_and_generation_origins() -> None:
    assert short_name("file:///tmp/x/job/savepoints/savepoint-1-ab12/") == "savepoint-1-ab12"
    assert short_name(None) == "empty state"
    assert origin("empty state (no completed checkpoint yet)") == "empty state"
    assert origin("resume in place at batch 3 (file:///tmp/x/job/chk-4)") == "chk-4"
    assert origin("savepoint file:///tmp/x/job/savepoints/savepoint-1-ab12 (batch 0)") == "savepoint-1-ab12"
    assert origin(None) == "-"


# ---------------------------------------------------------------------------- watcher and record


def _checkpoint(catalog: Catalog, checkpoint_id: int, batch: int, generation: int) -> SnapshotMetadata:
    """A checkpoint without files whose stats the demo's tables show (40 + id ms, 1300 of 9000 B copied)."""
    return put_checkpoint(catalog, {}, checkpoint_id=checkpoint_id, batch_id=batch, generation=generation,
                          stats=SnapshotStats(duration_ms=40 + checkpoint_id, bytes_copied=1300,
                                              bytes_total=9000))


def test_watcher_names_generations_by_role_and_remembers_retired_checkpoints(tmp_path: Path) -> None:
    catalog = Catalog.open(str(tmp_path), "totals")
    console = Console()
    watcher = Watcher(console)
    watcher.follow(catalog, ["blue", "green"])
    assert watcher.poll(catalog) == ("job totals: no driver has started yet", "")

    catalog.claim_generation({"plan": "empty state (no completed checkpoint yet)"})
    _checkpoint(catalog, 1, 0, 1)
    write_status(catalog, "stopped", last_batch=0, savepoint_uri="file:///r/totals/savepoints/savepoint-2-x1")
    line, extra = watcher.poll(catalog)
    assert line == ("blue (generation 1, from empty state): stopped, confirmed batch 0, checkpoints chk-1, "
                    "savepoint-2-x1")
    assert extra == ""

    catalog.claim_generation({"plan": "savepoint file:///r/totals/savepoints/savepoint-2-x1 (batch 0)"})
    _checkpoint(catalog, 3, 1, 2)
    (tmp_path / "totals" / "chk-1" / "_metadata").unlink()  # retired by retention
    write_status(catalog, "failed", last_batch=1, error="[STREAM_FAILED] ... RuntimeError: simulated failure")
    line, _ = watcher.poll(catalog)
    assert (line
            == ("green (generation 2, from savepoint-2-x1): failed, confirmed batch 1, checkpoints chk-3: "
                "RuntimeError: simulated failure"))
    assert [m.id for m in watcher.checkpoints_of("totals")] == [1, 3]
    assert watcher.states == {("totals", 1): "stopped", ("totals", 2): "failed"}

    write_status(catalog, "running", heartbeat_at=time.time() - 30)
    assert watcher.poll(catalog)[1].startswith(" (no heartbeat for 3")
    console.close()


def test_record_tables_show_generations_checkpoints_and_delta_history(tmp_path: Path) -> None:
    catalog = Catalog.open(str(tmp_path), "quickstart")
    t0 = time.time()
    catalog.claim_generation({"plan": "empty state (no completed checkpoint yet)",
                              "airflow": {"dag_id": "quickstart", "task_id": "totals", "try_number": "1"}})
    catalog.claim_generation({"plan": "latest checkpoint file:///r/quickstart/chk-3 (batch 2)",
                              "airflow": {"dag_id": "quickstart", "task_id": "totals", "try_number": "2"}})
    write_run_result(catalog,
                     RunResult(status="finished", job="quickstart", generation=2, first_batch=3, last_batch=7,
                               committed_batches=(3, 4, 5, 6, 7),
                               restored_from="file:///r/quickstart/chk-3"))
    roles = {1: "first try", 2: "retry"}

    lines = generation_table(catalog, roles.__getitem__, {("quickstart", 1): "running"}, t0)
    assert lines[0].split() == ["gen", "role", "started", "restored", "from", "outcome", "started", "by"]
    assert [line.split()[:3] for line in lines[2:]] == [["1", "first", "try"], ["2", "retry", "+0s"]]
    assert "empty state    died while running, no run result  " in lines[2]
    assert lines[2].endswith("quickstart.totals try 1")
    assert lines[3].endswith("chk-3          finished, batches 3..7, committed [3, 4, 5, 6, 7]  "
                             "quickstart.totals try 2")

    metas = [_checkpoint(catalog, i, i - 1, 2) for i in (4, 5)]
    records = {r.id: r for r in snapshot_records(catalog, "checkpoint")}
    reused = dataclasses.replace(records[5], generation=1, batch_id=1, created_at=metas[0].created_at - 1)
    lines = checkpoint_table([records[4], records[5], reused], [records[5]], roles.__getitem__)
    assert lines[0].split() == ["chk", "batch", "gen", "role", "ms", "copied", "total", "files", "now"]
    assert [line.split()[:3] for line in lines[2:]] == [["5", "1", "1"], ["4", "3", "2"], ["5", "4", "2"]]
    assert lines[3].split() == ["4", "3", "2", "retry", "44", "1.3", "KiB", "0", "B", "0", "retired"]
    assert lines[2].split()[-1] == "retired" and lines[4].split()[-1] == "retained"
    assert summary_lines(load_history(catalog)) == [
        "   checkpoints retained: 2 completed, 0 failed, 1 restores",
        "   duration over the 2 retained: min 44 ms, avg 44 ms, max 45 ms",
        "   copied over the 2 retained: min 1.3 KiB, avg 1.3 KiB, max 1.3 KiB",
        "   total over the 2 retained: min 0 B, avg 0 B, max 0 B",
    ]

    history = [{"version": 0, "operation": "CREATE TABLE", "job": None, "batch": None, "generation": None},
               {"version": 1, "operation": "MERGE", "job": "quickstart", "batch": 3, "generation": 2}]
    lines = delta_history_table(history, roles.__getitem__)
    assert lines[2].split() == ["0", "CREATE", "TABLE", "-", "-", "-", "-"]
    assert lines[3].split() == ["1", "MERGE", "quickstart", "3", "2", "retry"]


def test_delta_readers_parse_sparkpoint_commit_info_and_find_orphaned_staged_files(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake

    table = tmp_path / "totals"
    rows = pa.table({"user": ["u1"], "total": [5]})
    write_deltalake(str(table), rows)  # a commit that is not Sparkpoint's
    for batch, generation in ((1, 3), (0, 1)):
        info = {"sparkpoint.job": "totals", "sparkpoint.batch": str(batch),
                "sparkpoint.generation": str(generation)}
        write_deltalake(str(table), rows, mode="append",
                        commit_properties=CommitProperties(custom_metadata=info))

    history = delta_history(table)
    assert ([(e["version"], e["batch"], e["generation"]) for e in history]
            == [(0, None, None), (1, 1, 3), (2, 0, 1)])
    assert delta_commits(table) == [{"job": "totals", "batch": 0, "generation": 1},
                                    {"job": "totals", "batch": 1, "generation": 3}]
    assert delta_history(tmp_path / "missing") == [] and delta_commits(tmp_path / "missing") == []

    staged = table / "_sparkpoint_txn" / "totals" / "b2-g4"
    staged.mkdir(parents=True)
    (staged / "part-0.parquet").write_bytes(b"PAR1")
    assert orphaned_staged_files(table, "totals") == [str(staged / "part-0.parquet")]
    assert orphaned_staged_files(table, "other") == []


def test_console_keeps_its_own_lines_on_the_terminal_and_the_rest_in_the_log(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    console = Console()
    log = tmp_path / "airflow.log"
    with console.quiet(log):
        console.say("demo line")
        os.write(1, b"airflow noise\n")
        os.write(2, b"spark noise\n")
    os.write(1, b"after\n")
    console.close()
    out, err = capfd.readouterr()
    assert out == "demo line\nafter\n" and err == ""
    assert log.read_text() == "airflow noise\nspark noise\n"


ORPHAN_SCRIPT = """
import subprocess, sys, time
from airflow_sparkpoint.demo import command
command._adopt_orphans()
# A parent that starts a child and exits at once: spark-submit's JVM dying on Ctrl-C
# before the Python driver it started.
out = subprocess.run([sys.executable, "-c",
                      "import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', "
                      "'import time; time.sleep(300)'], "
                      "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)"],
                     capture_output=True, text=True, check=True).stdout
print(int(out), flush=True)
command._kill_children()
time.sleep(0.5)
"""


def test_kill_children_also_kills_an_orphan_whose_parent_exited_first() -> None:
    """On Ctrl-C spark-submit's JVM can exit before the Python driver it started; the
    orphan must still be killed by the demo, not re-parented past it and left running."""
    import subprocess
    import sys

    import psutil

    done = subprocess.run([sys.executable, "-c", ORPHAN_SCRIPT], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    orphan = int(done.stdout.split()[0])
    try:
        alive = psutil.pid_exists(orphan) and psutil.Process(orphan).status() != psutil.STATUS_ZOMBIE
        assert not alive, f"orphan {orphan} outlived the demo's _kill_children()"
    finally:
        if psutil.pid_exists(orphan):
            psutil.Process(orphan).kill()
