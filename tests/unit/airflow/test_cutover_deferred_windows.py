"""Review of the deferred cutover (issue 49, `SparkpointCutoverTrigger`): a window of
the pre-3.3 `cleanup` stand-in for `on_kill`, on a real local catalog."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.services.cutover import stop_after_batch
from airflow_sparkpoint.services.zero_downtime import DrivePosition, plan_cutover
from tests.support.cutover_actors import blue_runs
from tests.support.records import put_checkpoint

pytestmark = pytest.mark.airflow

JOB = "orders"
TASK = {"dag_id": "d", "task_id": "cutover", "run_id": "r1", "map_index": -1}


@pytest.fixture(autouse=True)
def _airflow(airflow_home: Path) -> None:
    return None



@pytest.mark.parametrize("state", ["scheduled", "running"])
def test_before_3_3_a_cancelled_copy_of_a_trigger_that_fired_does_not_call_off(
        catalog: Catalog, root: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, state: str) -> None:
    """Airflow may run one trigger in two triggerers at once (HA: a triggerer thought
    gone, its triggers taken over). One copy fires 'stopped' (blue stopped after N); the
    task resumes (scheduled, then running on a worker) and the other copy is cancelled.
    Before 3.3 its `cleanup` asks the task's state, finds it not deferred and calls the
    cutover off: blue stopped, green's claim then refused, a person restarts blue. A
    task that resumed from its trigger's event is not a user's stop."""
    from airflow_sparkpoint.triggers import run as module  # the stoppable triggers' cleanup reads it there

    monkeypatch.setattr(module, "NATIVE_ON_KILL", False)
    from airflow_sparkpoint.triggers.cutover import SparkpointCutoverTrigger

    catalog.claim_generation({"config": {"trigger": "processingTime:1s"}})  # blue: generation 1 at batch 5
    put_checkpoint(catalog, batch_id=5, generation=1)
    blue_runs(catalog, 5)
    cid = plan_cutover(catalog, green_root=str(tmp_path / "green"), requested_by="t").plan.id
    stop = stop_after_batch(catalog, 7, timeout_s=600.0, poll_s=1.0, max_heartbeat_age=60.0, requested_by="t",
                            wait=False, generation=1, cutover_id=cid)
    agreed = CutoverStore(catalog).agree(cid, 7, stop.request_id)
    now = time.time()
    position = DrivePosition("stop", agreed.at + 600, now, 7, stop.request_id)
    copy = SparkpointCutoverTrigger(job_name=JOB, cutover_id=cid, position=position.to_json(),
                                    checkpoint_dir=root,
                                    # the other copy's look: before blue stopped
                                    task=TASK, poll_interval=3600)

    async def state_of(*_args: Any) -> str:
        return state  # the first copy fired; its event resumed the task

    copy.state_of = state_of

    async def cancelled_after_a_look() -> None:
        async def consume() -> None:
            async for _event in copy.run():
                raise AssertionError("no event expected from this copy")

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.5)  # its first look: blue not stopped yet, it waits
        # blue stops after N (the first copy sees this and fires; the task resumes)
        channel = ControlChannel(catalog)
        (request,) = channel.pending(1)
        channel.acknowledge(request, 1)
        final = put_checkpoint(catalog, batch_id=7, generation=1)
        channel.complete(request, generation=1, batch_id=7, checkpoint=catalog.checkpoint_uri(final.id))
        blue_runs(catalog, 7, "stopped")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await copy.cleanup()

    asyncio.run(cancelled_after_a_look())
    done = CutoverStore(catalog).read(cid).done
    assert done is None, f"the cutover was called off after blue stopped, by a cancelled copy: {done}"
