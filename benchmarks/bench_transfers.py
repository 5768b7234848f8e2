"""Parallel vs one-at-a-time transfers (issue 18): a checkpoint's uploads, a savepoint's
copies and a restore's downloads of the files a 2,000,000-key state has in `bench_scale.py`
(two 9.8 MB changelogs of the first build, 16 changelogs of 0.5 MB, 30 small log files:
48 files, 28 MB), on local disk and on SeaweedFS (127.0.0.1).

Paired rounds in one process: each round runs every step with ``--threads`` transfers at
a time and with one at a time (`airflow_sparkpoint.checkpoints.transfer.THREADS`), in
alternating order, each into a fresh root; the ratio is the median of the rounds'
one-at-a-time ÷ parallel times (> 1: parallel is faster).

    .venv/bin/python benchmarks/bench_transfers.py [--stores local,s3] [--rounds 5] [--threads 8]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import emit, fresh, median
from _scale import log, seaweedfs

BATCHES = 9


def write_live(root: Path) -> int:
    """A live location shaped like the 2,000,000-key run's after its last batch."""
    rng = os.urandom
    files = {"metadata": rng(60)}
    for batch in range(BATCHES):
        for kind in ("offsets", "commits", "sources/0"):
            files[f"{kind}/{batch}"] = rng(300)
    files["state/0/_metadata/metadata"] = rng(200)
    files["state/0/_metadata/schema"] = rng(400)
    for part in (0, 1):
        files[f"state/0/{part}/1.changelog"] = rng(9_800_000)
        for version in range(2, BATCHES + 1):
            files[f"state/0/{part}/{version}.changelog"] = rng(500_000)
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return sum(len(d) for d in files.values())


def one_round(live: Path, root: str, work: Path, opts: dict[str, Any]) -> dict[str, float]:
    from airflow_sparkpoint.checkpoints import Catalog
    from airflow_sparkpoint.runtime.checkpointer import Checkpointer
    from airflow_sparkpoint.runtime.committer import Committer
    from airflow_sparkpoint.runtime.restore import materialize
    from airflow_sparkpoint.sinks.transactions import Fence

    catalog = Catalog.open(root, "bench", **opts)
    generation = catalog.claim_generation().generation
    fence = Fence(catalog, generation)
    committer = Committer(catalog=catalog, sink=None, fence=fence, commit_mode="checkpoint")  # type: ignore[arg-type]
    coordinator = Checkpointer(catalog=catalog, fence=fence, live_root=str(live), transactions=committer,
                               interval_s=0, num_retained=3, timeout_s=600, tolerable_failures=0)
    times = {}
    started = time.perf_counter()
    meta = coordinator.checkpoint(BATCHES - 1)
    times["checkpoint"] = time.perf_counter() - started
    assert meta is not None and meta.stats.files_copied == meta.stats.file_count
    started = time.perf_counter()
    savepoint = catalog.create_savepoint(catalog.handle(meta))
    times["savepoint"] = time.perf_counter() - started
    started = time.perf_counter()
    materialize(savepoint, str(work / "restored"), stored=False)
    times["materialize"] = time.perf_counter() - started
    shutil.rmtree(work / "restored", ignore_errors=True)
    return times


def run(stores: list[str], rounds: int, threads: int) -> dict[str, Any]:
    from airflow_sparkpoint.checkpoints import transfer

    results = []
    with tempfile.TemporaryDirectory(prefix="sparkpoint-transfers-", ignore_cleanup_errors=True) as tmp:
        live = fresh(Path(tmp) / "live")
        total = write_live(live)
        files = sum(1 for p in live.rglob("*") if p.is_file())
        s3cm = seaweedfs() if "s3" in stores else None
        s3 = s3cm.__enter__() if s3cm is not None else None
        try:
            for store in stores:
                opts = {"endpoint_url": s3[0]} if store == "s3" and s3 else {}
                times: dict[str, dict[str, list[float]]] = {"parallel": {}, "sequential": {}}
                for attempt in range(rounds):
                    order = ("parallel", "sequential") if attempt % 2 == 0 else ("sequential", "parallel")
                    for mode in order:
                        transfer.THREADS = threads if mode == "parallel" else 1
                        work = fresh(Path(tmp) / f"{store}-{attempt}-{mode}")
                        root = (str(work / "root") if store == "local"
                                else f"s3://{s3[1]}/t-{uuid.uuid4().hex[:8]}")  # type: ignore[index]
                        for step, seconds in one_round(live, root, work, opts).items():
                            times[mode].setdefault(step, []).append(seconds)
                        shutil.rmtree(work, ignore_errors=True)
                    log(f"  {store} round {attempt}: " + ", ".join(
                        f"{step} {times['sequential'][step][-1]:.2f} / {times['parallel'][step][-1]:.2f} s"
                        for step in times["parallel"]))
                ratios = {step: median(s / p for s, p in zip(times["sequential"][step],
                                                             times["parallel"][step],
                                                            strict=True)) for step in times["parallel"]}
                results.append({"store": store, "times": times, "ratios": ratios,
                                "median_s": {mode: {k: median(v) for k, v in t.items()}
                                             for mode, t in times.items()}})
        finally:
            transfer.THREADS = 8
            if s3cm is not None:
                s3cm.__exit__(None, None, None)
    return {"name": "transfers", "files": files, "bytes": total, "threads": threads, "rounds": rounds,
            "results": results, "s3_server": f"{s3[2]} (127.0.0.1)" if s3 else None,
            "pass": all(r["ratios"][k] >= 1.0 for r in results for k in r["ratios"]),
            "summary": "; ".join(f"{r['store']}: "
                                 + ", ".join(f"{k} {v:.2f}x" for k, v in r["ratios"].items())
                                 for r in results)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--stores", default="local,s3")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    result = run(args.stores.split(","), args.rounds, args.threads)
    lines = [(f"{result['files']} files, {result['bytes']:,} B; one at a time ÷ {args.threads} at a time "
              f"(median of {args.rounds} paired rounds)")]
    for r in result["results"]:
        m = r["median_s"]
        lines.append(f"{r['store']:<6} " + "  ".join(
            f"{k}: {m['sequential'][k]:.2f} s / {m['parallel'][k]:.2f} s = {v:.2f}"
            for k, v in r["ratios"].items()))
    emit(result, args.json, lines)
    return result


if __name__ == "__main__":
    sys.exit(0 if main()["pass"] else 1)
