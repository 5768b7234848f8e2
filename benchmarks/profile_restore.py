"""Where a restore's time goes (issue 18): one state of ``--keys`` keys built as in
`bench_scale.py`, a savepoint of it, then restarts of the same query, each with one new
batch, alternating: Sparkpoint restore; plain Spark restarting from a copy of the job's
live location; plain Spark restarting from the savepoint materialized by Sparkpoint
(what the restore hands to Spark). Prints Spark's own per-batch phases
(StreamingQueryProgress ``durationMs``) and state operator metrics for each, and the
state files (RocksDB snapshot ``.zip`` versions, changelogs) each location holds.

Spark's state store logs (``org.apache.spark.sql.execution.streaming.state``, INFO) go to
a file (``--state-log``, kept) from which each restart's state load is read: the RocksDB
snapshot version it starts from, the changelogs it replays and how long that takes.

    .venv/bin/python benchmarks/profile_restore.py [--keys 2000000] [--runs 1] [--out JSON] [--state-log FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import fresh, spark_session
from _scale import (
    Profiler,
    load_batches,
    log,
    state_loads,
    state_log_conf,
    state_log_offset,
    update_batches,
    write_numeric_batches,
)
from bench_scale import JOB, _conf, _run_job, _run_plain


def state_files(root: Path) -> dict[str, Any]:
    """Per state partition: snapshot (.zip) versions and changelog versions."""
    out: dict[str, Any] = {}
    for part in sorted(root.glob("state/*/*")):
        if not part.is_dir() or part.name.startswith("_"):
            continue
        names = os.listdir(part)
        zips = sorted(int(n.split(".")[0].split("_")[0]) for n in names if n.endswith(".zip"))
        logs = sorted(int(n.split(".")[0].split("_")[0]) for n in names if n.endswith(".changelog"))
        out[str(part.relative_to(root))] = {"zips": zips, "changelogs": logs}
    return out


def progress_of(prof: Profiler, since: int) -> list[dict[str, Any]]:
    time.sleep(0.5)
    return [{"batch": p["batchId"], "rows": p.get("numInputRows"), "durationMs": p["durationMs"],
             "stateOperators": [{k: v for k, v in op.items() if k != "customMetrics"}
                                | {"custom": op.get("customMetrics")}
                                for op in p.get("stateOperators", [])]}
            for p in prof.progress[since:] if p.get("numInputRows", 0) > 0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--updates", type=int, default=8)
    parser.add_argument("--change", type=float, default=0.05)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--out", default="", help="write the JSON profile here")
    parser.add_argument("--state-log", default="", help="keep Spark's state store log here")
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="sparkpoint-profile-log-"))
    log_conf, state_log = state_log_conf(logs)
    spark = spark_session("profile-restore", extra={
        "spark.driver.memory": "6g", "spark.sql.streaming.stateStore.maintenanceInterval": "30s", **log_conf})
    prof = Profiler().install().listen(spark)
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.catalog import open_snapshot
    from airflow_sparkpoint.runtime import restore as restore_mod

    report: dict[str, Any] = {"keys": args.keys, "runs": []}
    with tempfile.TemporaryDirectory(prefix="sparkpoint-profile-", ignore_cleanup_errors=True) as tmp:
        base = Path(tmp)
        history = load_batches(args.keys, 5_000_000) + update_batches(args.keys, args.change, args.updates,
                                                                      seed=7)
        write_numeric_batches(base / "input", history)
        root = str(base / "origin")
        took, built = _run_job(spark, base / "input", base / "origin-out",
                               _conf(root, base / "origin-work", "latest", len(history) + 10, None))
        assert built.status == "finished", built
        log(f"built {args.keys:,} keys in {took:.0f} s")
        catalog = Catalog.open(root, JOB)
        savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
        sp = open_snapshot(savepoint.uri)
        new_batch = update_batches(args.keys, args.change, 1, seed=99)
        write_numeric_batches(base / "input", new_batch, start=len(history))
        live = next(p.parent for p in sorted((base / "origin-work").rglob("offsets")) if p.is_dir())
        report["live_state"] = state_files(live)
        report["savepoint_files"] = len(sp.metadata.files)
        report["savepoint_bytes"] = sp.metadata.total_bytes
        mat = base / "materialized"
        started = time.perf_counter()
        restore_mod.materialize(sp, str(mat), stored=False)
        report["materialize_s"] = time.perf_counter() - started
        report["savepoint_state"] = state_files(mat)
        log(json.dumps({"live": report["live_state"], "savepoint": report["savepoint_state"]}))
        for attempt in range(args.runs):
            for name in ("restore", "plain_live", "plain_savepoint"):
                work = fresh(base / f"{name}-{attempt}")
                since = len(prof.progress)
                marker = f"=== {name} round {attempt} ==="
                log_from = state_log_offset(state_log)
                if name == "restore":
                    shutil.copytree(base / "origin-out", work / "out", copy_function=os.link)
                    before = len(prof.restores)
                    took, restored = _run_job(spark, base / "input", work / "out",
                                            _conf(str(work / "root"), work, savepoint.uri, 3, None))
                    assert restored.restored_from == savepoint.uri, restored
                    extra_info = {"materialize_s": sum(r["materialize"] for r in prof.restores[before:])}
                else:
                    src = live if name == "plain_live" else mat
                    shutil.copytree(src, work / "chk", ignore=shutil.ignore_patterns(".sparkpoint-*"))
                    took = _run_plain(spark, base / "input", work / "out", work / "chk")
                    extra_info = {}
                entry = {"name": name, "round": attempt, "wall_s": took, **extra_info,
                         "state_load": state_loads(state_log, log_from, state_log_offset(state_log)),
                         "progress": progress_of(prof, since)}
                report["runs"].append(entry)
                log(f"{marker} wall {took:.1f} s, state load {json.dumps(entry['state_load'])}: "
                    f"{json.dumps(entry['progress'])}")
                shutil.rmtree(work, ignore_errors=True)
    spark.stop()
    if args.state_log:
        shutil.copy(state_log, args.state_log)
    shutil.rmtree(logs, ignore_errors=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
