"""Does the S3 server's LIST of a prefix get slower as objects under it come and go?

In the soak (`soak.py`) a checkpoint's LIST of ``shared/`` took longer late in a run
(7.6 -> 10.4 ms over two hours, objects +7 %), a new client's LIST of the same prefix grew
with it, and `s3_client_age.py` showed the client does not age. What is left is the
server. This reproduces the churn of ``shared/`` without Spark: a prefix laid out like it
(``offsets/``, ``commits/``, ``state/0/<partition>/``) gets each batch's new objects and,
like retention, loses the objects of the batch `RETAINED` batches older, so it always
holds the same number of objects (by default about the 1,100 under the soak's
``shared/``; the two-hour soak deletes about 10,000 there, 4 per checkpoint, and the
default 12 rounds of 1,000 batches delete 72,000 to make a trend stand out of the
noise). A second prefix with the same layout and count is never
touched. After each round, 40 LISTs of each alternate (each going first in turn): their
median ratio (churned / untouched) cancels what the machine does meanwhile. Flat means a
listing's time follows the objects it returns; growing means it follows what was deleted.

Against SeaweedFS started here (`s3_server.sh`, stopped at the end):

    .venv/bin/python benchmarks/s3_listing_churn.py [--rounds 12] [--batches 1000] [--json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _bench import emit, machine

PARTITIONS = 4
#: batches whose objects a prefix holds (6 objects each: offsets, commits, a changelog per
#: partition): about the 1,100 objects under the soak's ``shared/``
RETAINED = 180
LISTS = 40
#: the listing follows what was deleted if churned / untouched grows more than this
DRIFT_GOAL = 1.1


def batch_keys(prefix: str, batch: int) -> list[str]:
    """The objects one batch adds under `prefix`, named like ``shared/`` names them."""
    tag = f"~{batch:016x}"
    return [f"{prefix}/offsets/{batch}{tag}", f"{prefix}/commits/{batch}{tag}",
            *(f"{prefix}/state/0/{p}/{batch + 1}.changelog{tag}" for p in range(PARTITIONS))]


def measure(endpoint: str, bucket: str, rounds: int, batches: int,
            retained: int = RETAINED) -> list[dict[str, float]]:
    from airflow_sparkpoint.storage import open_storage

    store = open_storage(f"s3://{bucket}/churn", endpoint_url=endpoint, region_name="us-east-1")
    body = b"x" * 400
    for batch in range(retained):
        for key in batch_keys("churned", batch) + batch_keys("untouched", batch):
            store.put(key, body)

    def timed_list(prefix: str) -> tuple[float, int]:
        began = time.perf_counter()
        count = sum(1 for _ in store.list(prefix))
        return time.perf_counter() - began, count

    rows, next_batch, deleted = [], retained, 0
    for r in range(rounds + 1):
        if r:  # round 0 measures before any churn
            for _ in range(batches):
                for key in batch_keys("churned", next_batch):
                    store.put(key, body)
                gone = batch_keys("churned", next_batch - retained)
                store.delete(gone)
                deleted += len(gone)
                next_batch += 1
        times: dict[str, list[float]] = {"churned": [], "untouched": []}
        counts: dict[str, int] = {}
        for i in range(LISTS):
            for name in ("churned", "untouched")[:: 1 if i % 2 else -1]:
                seconds, counts[name] = timed_list(name)
                times[name].append(seconds)
        if counts["churned"] != counts["untouched"]:
            raise RuntimeError(f"the prefixes hold {counts}, expected the same count")
        row = {"round": r, "deleted": deleted, "objects": counts["churned"],
               **{f"list_{k}_ms": statistics.median(v) * 1000 for k, v in times.items()}}
        row["ratio"] = row["list_churned_ms"] / row["list_untouched_ms"]
        rows.append(row)
        print(f"round {r:2d}  {deleted:6d} deleted  {counts['churned']} objects  LIST churned "
              f"{row['list_churned_ms']:6.2f} ms untouched {row['list_untouched_ms']:6.2f} ms "
              f"({row['ratio']:.2f})",
              file=sys.stderr, flush=True)
    store.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=12, help="rounds of churn after the first measurement")
    parser.add_argument("--batches", type=int, default=1000,
                        help="batches per round (6 objects in, 6 out each)")
    parser.add_argument("--retained", type=int, default=RETAINED, help="batches each prefix holds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from _scale import seaweedfs

    with seaweedfs("churn") as (endpoint, bucket, version):
        rows = measure(endpoint, bucket, args.rounds, args.batches, args.retained)
    quarter = max(1, len(rows) // 4)
    first, last = rows[:quarter], rows[-quarter:]

    def mean(part: list[dict[str, float]], key: str) -> float:
        return statistics.mean(r[key] for r in part)

    drift = mean(last, "ratio") / mean(first, "ratio")
    result = {"benchmark": "s3_listing_churn", "server": version, "machine": machine(), "rounds": rows,
              "ratio_drift": drift, "deleted": rows[-1]["deleted"], "objects": rows[-1]["objects"],
              "pass": drift <= DRIFT_GOAL,
              "summary": "LIST of a churned prefix / an untouched one with the same "
                         f"{rows[-1]['objects']} objects, "
                         f"last quarter of rounds / first: {drift:.2f} after {rows[-1]['deleted']} deletions "
                         f"(churned {mean(first, 'list_churned_ms'):.1f} -> "
                         f"{mean(last, 'list_churned_ms'):.1f} ms; "
                         f"goal <= {DRIFT_GOAL})"}
    emit(result, args.json, [f"{rows[-1]['deleted']} objects put and deleted under one prefix of {version}"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
