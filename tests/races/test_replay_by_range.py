"""The self-healing replay (#15) for a source with Kafka's offsets, read again by range (#29).

No Kafka connector can be installed here; `tests.races.partitioned_source` is a Python
data source with the Kafka source's offset shape (``{"events": {"<partition>": offset}}``)
over append-only partition files, read by range. A keyed-totals job (merged into Delta,
``commit.mode=checkpoint``) reads several partitions, at most two records of each per
batch; a partition appears while it runs (between batches 2 and 3). The driver is
SIGKILLed, the two newest checkpoints are damaged, so the restart point (batch 2) is
behind the sink (batch 4), and new input arrives: more records in every partition, and a
new partition. The restart replays batches 3 and 4 from the offsets their commits
recorded and continues. A replay that let the source plan those batches again would read
the new records into batches whose output the sink skips, and lose them.

The totals are checked user by user against the records the test wrote, summed in plain Python.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.runtime import replay
from airflow_sparkpoint.runtime.livedir import source_offsets
from tests.support.sink_cases import DeltaMergeCase
from tests.support.sink_races import JOB, WAIT_S, Scene, differences, explain
from tests.support.waits import wait_for

# The stand-in source's read limits (ReadMaxRows) came with PySpark 4.2: older lines skip.
pytest.importorskip("pyspark.sql.streaming.datasource",
                    reason="Python streaming read limits need PySpark >= 4.2")
from tests.races.partitioned_source import TOPIC, append, lengths

# slow: two drivers, one of them idle between batches while the test writes input
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1800)]

USERS = ("u0", "u1", "u2")


def produce(inputs: Path, partition: int, count: int) -> list[dict[str, Any]]:
    """`count` more records in `partition`, returned as written (the oracle's input): ids
    unique, users shared by every partition, and every fourth record a user of the
    partition's own."""
    start = lengths(inputs, TOPIC).get(str(partition), 0)
    return append(inputs, TOPIC, partition, [
        {"id": partition * 1000 + k, "user": [*USERS, f"p{partition}"][k % 4],
         "amount": partition * 100 + k + 1}
        for k in range(start, start + count)
    ])


def recorded_offsets(case: DeltaMergeCase, batch: int) -> Any:
    """The source offset the commit of `batch` recorded (its replay record)."""
    body = replay.decode(case.sink().replay_record(JOB, batch) or "")
    assert isinstance(body, dict), f"batch {batch} has no replay record: {body}"
    (line,) = source_offsets(body["offsets"])
    return json.loads(line)


@pytest.fixture()
def scene(tmp_path: Path) -> Iterator[Scene]:
    scene = Scene(tmp_path, DeltaMergeCase(tmp_path), args=["--source", "partitioned"])
    try:
        yield scene
    finally:
        scene.stop()


def test_a_restart_behind_the_sink_replays_structured_offsets_by_range_and_continues(scene: Scene) -> None:
    case = scene.case
    assert isinstance(case, DeltaMergeCase)
    written = produce(scene.inputs, 0, 6) + produce(scene.inputs, 1, 4)
    first = scene.start("first", {"spark.sparkpoint.trigger": "processingTime:1s"})

    def position() -> int:
        found = case.sink().committed_position(JOB)
        return -1 if found is None else int(found)

    def committed(batch: int) -> None:
        wait_for(f"batch {batch} in the sink", lambda: position() >= batch, WAIT_S, first.tail,
                 proc=first.proc)
        assert position() == batch, explain(scene.drivers)

    committed(2)  # batches 0..2: partitions 0 and 1, two records of each at most
    written += produce(scene.inputs, 2, 3)  # a partition appears while the job runs
    committed(4)
    assert recorded_offsets(case, 2) == {TOPIC: {"0": 6, "1": 4}}
    assert recorded_offsets(case, 3) == {TOPIC: {"0": 6, "1": 4, "2": 2}}
    assert recorded_offsets(case, 4) == {TOPIC: {"0": 6, "1": 4, "2": 3}}
    assert first.proc.poll() is None, first.tail()
    first.stop()
    assert first.proc.returncode == -signal.SIGKILL, first.tail()

    damaged = scene.damage_newest(("truncate", "delete"))
    assert damaged == [4, 3]
    fallback = scene.catalog().checkpoints()[0]
    assert fallback.batch_id == 2, "the restart point is not behind the sink"
    for partition, count in ((0, 1), (1, 2), (2, 2), (3, 3)):  # every partition grows; partition 3 is new
        written += produce(scene.inputs, partition, count)
    healed = scene.run("healed")

    assert healed.proc.returncode == 0, healed.tail()
    assert len(written) == 6 + 4 + 3 + 1 + 2 + 2 + 3
    assert differences(case, written, case.rows()) == [], explain(scene.drivers, scene.catalog())
    result = healed.result
    assert result is not None
    assert result["restored_from"] == scene.catalog().checkpoint_uri(fallback.id)
    assert result["recovered"].get("replayed") == [3, 4], result["recovered"]
    assert "replaying batches 3..4" in healed.output, healed.tail()
    assert result["first_batch"] == 5 and result["last_batch"] == 6, result
    assert recorded_offsets(case, 6) == {TOPIC: {"0": 7, "1": 6, "2": 5, "3": 3}}
    sink = case.sink()
    for batch in (3, 4):  # still the first run's commits: nothing was committed twice
        held = sink.committed_txn(JOB, batch)
        assert held is not None and held.generation == 1, (batch, held)
    assert case.leftovers(JOB) == [] and scene.catalog().transactions() == []
