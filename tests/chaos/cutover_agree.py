"""The orchestrator's agreement step of a zero-downtime cutover, as its own process (so
the chaos trial can kill it at ``cutover_agreement``): ask blue (generation G) to stop
after batch N (`services.cutover.stop_after_batch`, not waited for; the request names the
cutover, as the orchestrator's does), then record the
agreement (`checkpoints.cutover.CutoverStore.agree`), in that order (docs/PROTOCOL.md).

    python tests/chaos/cutover_agree.py --dir ROOT --job JOB --cutover CID --after-batch N --generation G
"""

from __future__ import annotations

import argparse

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.services.cutover import stop_after_batch


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("--dir", "--job", "--cutover"):
        parser.add_argument(name, required=True)
    parser.add_argument("--after-batch", type=int, required=True)
    parser.add_argument("--generation", type=int, required=True)
    args = parser.parse_args()
    catalog = Catalog.open(args.dir, args.job)
    stop = stop_after_batch(catalog, args.after_batch, timeout_s=300.0, poll_s=0.3, max_heartbeat_age=60.0,
                            requested_by="chaos-orchestrator", wait=False, generation=args.generation,
                            cutover_id=args.cutover)
    CutoverStore(catalog).agree(args.cutover, args.after_batch, stop.request_id)
    print(f"agreed: cutover {args.cutover} at batch {args.after_batch}, request {stop.request_id}",
          flush=True)


if __name__ == "__main__":
    main()
