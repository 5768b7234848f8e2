"""What a run start pays to learn a file sink's committed position, as the job ages.

`S3Sink` and `DirectorySink` keep one claim per batch for ever (``_sparkpoint/manifests/
<job>/<batch>.json``): about 200,000 a week at a batch every 3 s. A run start asks for
the sink's position three or four times (the checks before and after the generation
claim, after settling, the replay). It used to list every claim each time; it now reads
the newest claim marker (``_sparkpoint/claimed/<job>/...``, newest first), checks its
claim, and looks at the batch after it (`sinks._manifests.committed_position`).

For each count of claims (``--claims``), against SeaweedFS started here (`s3_server.sh`,
stopped at the end): the claims are written as the sink leaves them (a claim per batch,
the markers pruning leaves: at most 128), then ``--rounds`` alternating reads of the
position by the old rule (the newest of a listing of every claim) and by the new one;
medians, their ratio, and the requests each made.

    .venv/bin/python benchmarks/claims_position.py [--claims 2000,20000,100000] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _bench import emit, machine

JOB = "orders"
#: requests the marker rule may make at any age (a LIST, a HEAD of its claim, one of the next batch's)
MARKER_REQUESTS_GOAL = 4


def measure(endpoint: str, bucket: str, claims: int, rounds: int) -> dict[str, float]:
    from airflow_sparkpoint.sinks import _manifests as manifests
    from airflow_sparkpoint.storage import Storage, open_storage
    from airflow_sparkpoint.storage.counting import CountingStorage

    store = open_storage(f"s3://{bucket}/out-{claims}", endpoint_url=endpoint, region_name="us-east-1")

    def claim(batch: int) -> None:
        store.put(manifests.manifest_key(JOB, batch), json.dumps(
            {"schema_version": 2, "state": "done", "job": JOB, "batch_id": batch, "generation": 1,
             "txn_id": f"{JOB}-b{batch}-g1", "files": [{"path": f"part-{JOB}-b{batch}-g1-00000.parquet",
                                                         "size": 4096}]}).encode())

    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(claim, range(claims)))
        kept = range(max(0, claims - 2 * manifests.MARKERS_KEPT), claims)  # what pruning leaves
        list(pool.map(lambda b: store.put(manifests.marker_key(JOB, b), b""), kept))

    def old_rule(s: Storage, job: str) -> int | None:
        batches = manifests.claimed_batches(s, job)
        return batches[-1] if batches else None

    times: dict[str, list[float]] = {"listing": [], "marker": []}
    requests: dict[str, int] = {}
    for r in range(rounds):
        for name, read in (("listing", old_rule), ("marker",
                                                   manifests.committed_position))[:: 1 if r % 2 else -1]:
            counting = CountingStorage(store)
            began = time.perf_counter()
            found = read(counting, JOB)
            times[name].append(time.perf_counter() - began)
            requests[name] = counting.total
            if found != claims - 1:
                raise RuntimeError(f"{name}: position {found}, expected {claims - 1}")
    store.close()
    row = {"claims": claims, **{f"{k}_ms": statistics.median(v) * 1000 for k, v in times.items()},
           "listing_pages": -(-claims // 1000), "marker_requests": requests["marker"]}
    row["ratio"] = row["marker_ms"] / row["listing_ms"]
    print(f"{claims:7d} claims: listing {row['listing_ms']:8.1f} ms, marker {row['marker_ms']:6.1f} ms "
          f"({row['ratio']:.3f}); requests: {-(-claims // 1000)} LIST pages vs {requests['marker']}",
          file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", default="2000,20000,100000", help="claim counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    from _scale import seaweedfs

    counts = [int(c) for c in args.claims.split(",")]
    with seaweedfs("claims") as (endpoint, bucket, version):
        rows = [measure(endpoint, bucket, count, args.rounds) for count in counts]
    last = rows[-1]
    result = {"benchmark": "claims_position", "server": version, "machine": machine(), "rows": rows,
              "ratio": last["ratio"], "pass": all(r["marker_requests"] <= MARKER_REQUESTS_GOAL for r in rows),
              "summary": f"a file sink's committed position at {last['claims']:,} claims: "
                         f"{last['marker_ms']:.1f} ms from the newest marker vs {last['listing_ms']:.1f} ms "
                         f"listing every claim ({last['ratio']:.4f}); at {rows[0]['claims']:,}: "
                         f"{rows[0]['marker_ms']:.1f} vs {rows[0]['listing_ms']:.1f} ms"}
    emit(result, args.json, [f"claims written to {version}; {args.rounds} rounds each"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
