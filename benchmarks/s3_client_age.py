"""Does one long-lived S3 store's time per request grow with the requests it has made?

The soak (`soak.py`) saw a checkpoint's S3 requests take longer late in a run (LIST
7.6 -> 10.4 ms, GET 1.4 -> 2.1 ms over two hours) with the same number and size of
requests. This isolates the client: one `S3Storage` makes the checkpoint's mix of
requests (per checkpoint 1 LIST of 200 objects, 12 GETs, 3 PUTs, 4 HEADs of missing keys)
round after round; after each round, 60 LISTs and 60 GETs alternate between it and a
store created for that round, each going first in turn. Their median ratio (long-lived /
fresh) cancels what the machine and the server do meanwhile: flat means the client does
not age.

Against SeaweedFS started here (`s3_server.sh`, stopped at the end):

    .venv/bin/python benchmarks/s3_client_age.py [--rounds 25] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _bench import emit, machine

CHECKPOINTS_PER_ROUND = 100
SHARED = 200
#: the client ages if its time per request, relative to a fresh one's, grows more than this
DRIFT_GOAL = 1.1


def measure(endpoint: str, bucket: str, rounds: int) -> list[dict[str, float]]:
    from airflow_sparkpoint.storage import open_storage

    def store() -> Any:
        return open_storage(f"s3://{bucket}/age", endpoint_url=endpoint, region_name="us-east-1")

    def timed(s: Any, op: Callable[[Any], object]) -> float:
        began = time.perf_counter()
        op(s)
        return time.perf_counter() - began

    def listing(s: Any) -> int:
        return sum(1 for _ in s.list("shared/"))

    def get(s: Any) -> bytes:
        return bytes(s.get("shared/f0007"))

    aged = store()
    for i in range(SHARED):
        aged.put(f"shared/f{i:04d}", b"x" * 3000)
    requests, rows = 0, []
    for r in range(rounds):
        for c in range(CHECKPOINTS_PER_ROUND):
            listing(aged)
            for k in range(12):
                aged.get(f"shared/f{(c * 12 + k) % SHARED:04d}")
            for k in range(3):
                aged.put(f"chk/{r}-{c}-{k}", b"y" * 500)
            for k in range(4):
                aged.exists(f"missing/{k}")
            requests += 20
        fresh = store()
        listing(fresh)  # its connection and credentials, not timed
        times: dict[str, list[float]] = {"list_aged": [], "list_fresh": [], "get_aged": [], "get_fresh": []}
        for i in range(60):
            # Which store goes first alternates: a request right after another kind runs slower.
            for name, s in (("aged", aged), ("fresh", fresh))[:: 1 if i % 2 else -1]:
                times[f"list_{name}"].append(timed(s, listing))
            for name, s in (("aged", aged), ("fresh", fresh))[:: 1 if i % 2 else -1]:
                times[f"get_{name}"].append(timed(s, get))
        fresh.close()
        row = {"round": r, "requests": requests, **{k: statistics.median(v) * 1000 for k, v in times.items()}}
        row["list_ratio"] = row["list_aged"] / row["list_fresh"]
        row["get_ratio"] = row["get_aged"] / row["get_fresh"]
        rows.append(row)
        print(f"round {r:2d}  {requests:6d} requests  LIST aged {row['list_aged']:6.2f} ms fresh "
              f"{row['list_fresh']:6.2f} ms ({row['list_ratio']:.2f})  GET aged "
              f"{row['get_aged']:5.2f} ms fresh "
              f"{row['get_fresh']:5.2f} ms ({row['get_ratio']:.2f})", file=sys.stderr, flush=True)
    aged.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=25,
                        help=f"rounds of {CHECKPOINTS_PER_ROUND} checkpoints' requests")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from _scale import seaweedfs

    with seaweedfs("age") as (endpoint, bucket, version):
        rows = measure(endpoint, bucket, args.rounds)
    quarter = max(1, len(rows) // 4)

    def drift(key: str) -> float:
        return (statistics.mean(r[key] for r in rows[-quarter:])
                / statistics.mean(r[key] for r in rows[:quarter]))

    list_drift, get_drift = drift("list_ratio"), drift("get_ratio")
    result = {"benchmark": "s3_client_age", "server": version, "machine": machine(), "rounds": rows,
              "list_ratio_drift": list_drift, "get_ratio_drift": get_drift,
              "pass": max(list_drift, get_drift) <= DRIFT_GOAL,
              "summary": "aged / fresh, last quarter of rounds / first: LIST "
                         f"{list_drift:.2f}, GET {get_drift:.2f} "
                         f"(goal <= {DRIFT_GOAL})"}
    emit(result, args.json, [f"{rows[-1]['requests']} requests on one store against {version}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
