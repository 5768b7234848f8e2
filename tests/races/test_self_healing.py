"""The self-healing fallback (#15): the newest checkpoints are damaged after their batches
were committed (``commit.mode=checkpoint``), new input arrives, and a restart with no
extra settings falls back to the newest valid checkpoint, replays the batches the sink
already holds with the offsets each commit recorded (`airflow_sparkpoint.runtime.replay`),
and continues with the new input. Output is checked row by row against the input files.

The new input includes a file that sorts *between* files already read (Spark's file
source orders by modification time): a replay that let Spark choose its batches again
would read it inside a replayed batch, whose output the sink skips, and lose it.

Without the recorded offsets (a commit of an older release: the record is stripped from
the sink) the restart still refuses with `SinkAheadError`, and says why.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.s3_servers import S3Context
from tests.support.sink_cases import DeltaAppendCase, DeltaMergeCase, DirectoryCase, S3Case, SinkCase
from tests.support.sink_races import JOB, Scene, differences, explain, odd_file, write_inputs

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1800)]

CASES: dict[str, type[SinkCase]] = {
    "delta-merge": DeltaMergeCase, "delta-append": DeltaAppendCase, "directory": DirectoryCase, "s3": S3Case,
}


@pytest.fixture()
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    name = request.node.callspec.params["sink"]
    s3 = None
    if name == "s3":
        import boto3

        endpoint = request.getfixturevalue("s3_server_process")
        bucket = f"sp-heal-{uuid.uuid4().hex[:10]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        s3 = S3Context(endpoint, bucket)
    scene = Scene(tmp_path, CASES[name](tmp_path, s3))
    try:
        yield scene
    finally:
        scene.stop()


def sink_param(name: str, *, slow: bool = False) -> Any:
    marks = [pytest.mark.slow] if slow else []
    if name == "s3":
        marks.append(pytest.mark.s3)
    return pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("sink", [sink_param("delta-merge"), sink_param("delta-append", slow=True),
                                  # slow: the default run is at its 40-minute budget
                                  sink_param("directory", slow=True), sink_param("s3", slow=True)])
def test_a_restart_behind_the_sink_replays_the_committed_batches_and_continues(
    scene: Scene, sink: str
) -> None:
    expected = write_inputs(scene.inputs, [0, 1, 2, 3])
    first = scene.run("first")
    assert first.proc.returncode == 0, first.tail()
    assert scene.case.sink().committed_position(JOB) == 3

    damaged = scene.damage_newest(("truncate", "delete"))
    assert damaged == [3, 2]
    fallback = scene.catalog().checkpoints()[0]
    assert fallback.batch_id == 1
    expected += odd_file(scene.inputs, after=1) + write_inputs(scene.inputs, [4])
    healed = scene.run("healed")

    assert healed.proc.returncode == 0, healed.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    result = healed.result
    assert result is not None
    assert result["restored_from"] == scene.catalog().checkpoint_uri(fallback.id)
    assert result["recovered"].get("replayed") == [2, 3], result["recovered"]
    assert result["first_batch"] == 4 and result["last_batch"] == 5, result
    assert "replaying batches 2..3" in healed.output, healed.tail()
    sink_now = scene.case.sink()
    for batch in (2, 3):  # still the first run's commits: nothing was committed twice
        held = sink_now.committed_txn(JOB, batch)
        assert held is not None and held.generation == 1, (batch, held)
        assert 0 < len(sink_now.replay_record(JOB, batch) or "") < 2048, \
            "the replay record is missing or large"
    assert scene.case.leftovers(JOB) == []
    catalog = scene.catalog()
    assert catalog.transactions() == []
    assert catalog.checkpoints()[0].batch_id == 5, "the new checkpoints continue after the replayed batches"


# slow: the default run has the same refusal for Delta (tests/chaos/test_corruption.py)
@pytest.mark.parametrize("sink", [sink_param("directory", slow=True)])
def test_without_recorded_offsets_the_restart_still_refuses_and_says_why(scene: Scene, sink: str) -> None:
    write_inputs(scene.inputs, [0, 1, 2, 3])
    first = scene.run("first")
    assert first.proc.returncode == 0, first.tail()
    # Batch 3 committed by an older release: its claim carries no replay record.
    manifest = Path(scene.case.output()) / "_sparkpoint" / "manifests" / JOB / "3.json"
    claim = json.loads(manifest.read_text())
    assert "replay" in claim, "the commit did not record its offsets"
    del claim["replay"]
    manifest.write_text(json.dumps(claim))
    scene.damage_newest(("truncate",))
    generation = scene.catalog().current_generation()
    before = sorted(map(json.dumps, scene.case.rows()))

    refused = scene.run("refused")

    assert refused.proc.returncode != 0
    assert "SinkAheadError" in refused.output, refused.tail()
    assert "has already committed batch 3 of job 'race'" in refused.output, refused.tail()
    assert "batch 3 was committed without a replay record" in refused.output, refused.tail()
    assert scene.catalog().current_generation() == generation, "refused, yet it claimed a generation"
    assert sorted(map(json.dumps, scene.case.rows())) == before


@pytest.mark.slow
@pytest.mark.parametrize("sink", [sink_param("delta-merge", slow=True)])
def test_a_driver_killed_halfway_through_the_replay_is_replayed_again(scene: Scene, sink: str) -> None:
    expected = write_inputs(scene.inputs, [0, 1, 2, 3])
    first = scene.run("first")
    assert first.proc.returncode == 0, first.tail()
    scene.damage_newest(("delete", "truncate"))
    expected += write_inputs(scene.inputs, [4])

    killed = scene.start("killed", pause=("replay:3",))
    held = killed.wait_for("replay")  # batch 2 is replayed, batch 3 is next
    assert held is not None and held["batch"] == 3
    killed.stop()
    healed = scene.run("healed")

    assert healed.proc.returncode == 0, healed.tail()
    assert differences(scene.case, expected, scene.case.rows()) == [], explain(scene.drivers, scene.catalog())
    result = healed.result
    assert result is not None and result["recovered"]["replayed"] == [2, 3]
    assert result["first_batch"] == 4 and result["generation"] == 3
    assert scene.case.leftovers(JOB) == [] and scene.catalog().transactions() == []
