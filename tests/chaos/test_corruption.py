"""Invariant 1 under a real restart: a truncated, garbled or checksum-mismatched
``_metadata``, or a referenced file gone missing, makes the latest checkpoint invalid;
a real spark-submit restart (``restore=latest``) falls back to the previous valid
checkpoint, says so (the warning names the path, in the driver's output) and the output
is exact. With the sink already past the fallback (invariant 4) the restart replays the
batches the table holds with the offsets their commits recorded (the self-healing
fallback); when a commit carries no such record it is refused, unless
``restore.sinkAhead=rewind``, after which the output is exact again.

One job lineage (Delta merge sink; a headline promise, in the default run): ``external`` commit mode with the
commit step publishing only up to the checkpoint before the latest (write-audit-publish), so
the fallback is never behind the table; then ``checkpoint`` mode for the refusal.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog, SnapshotMetadata
from airflow_sparkpoint.services.commit import commit_pending
from tests.chaos.cases import JOB, job_script
from tests.chaos.harness import BATCHES, Run, chaos_seed, compare, spark_submit, write_inputs
from tests.support.sink_cases import DeltaMergeCase

pytestmark = [pytest.mark.spark, pytest.mark.timeout(3600)]

KINDS = ("truncated", "garbled", "checksum", "missing-file")


def corrupt(catalog: Catalog, kind: str, latest: SnapshotMetadata, previous: SnapshotMetadata,
            rng: random.Random) -> str:
    """Damage checkpoint `latest` in the way `kind` says; return a description."""
    key = f"chk-{latest.id}/_metadata"
    data = catalog.store.get(key)
    if kind == "truncated":
        catalog.store.put(key, data[: rng.randrange(1, len(data) - 1)])
        return "truncated _metadata"
    if kind == "garbled":
        start = rng.randrange(0, len(data) - 64)
        catalog.store.put(key,
                          data[:start] + bytes(rng.randrange(256) for _ in range(64)) + data[start + 64:])
        return "64 garbled bytes in _metadata"
    if kind == "checksum":
        body = json.loads(data)
        body["created_at"] = body["created_at"] + 1.0  # still valid JSON of the right shape
        catalog.store.put(key, json.dumps(body, sort_keys=True, indent=1).encode())
        return "_metadata modified, checksum kept"
    own = sorted({f.key for f in latest.files} - {f.key for f in previous.files})
    assert own, "the latest checkpoint has no file of its own"
    victim = next((k for k in own if k.startswith("shared/commits/")), own[0])
    catalog.store.delete([victim])
    return f"referenced file {victim} deleted"


def restart(case: DeltaMergeCase, conf: dict[str, str], base: Path, name: str) -> Run:
    args = ["--input", str(base / "input"), "--output", case.output()]
    return spark_submit(job_script(case), conf=conf, args=args, log=base / f"{name}.log")


def two_newest(catalog: Catalog) -> tuple[SnapshotMetadata, SnapshotMetadata]:
    valid = catalog.checkpoints()
    assert len(valid) >= 2, [m.id for m in valid]
    return valid[0], valid[1]


def test_restart_falls_back_from_every_kind_of_corrupt_checkpoint(tmp_path: Path) -> None:
    rng = random.Random(chaos_seed())
    case = DeltaMergeCase(tmp_path)
    root = tmp_path / "checkpoints"
    catalog = Catalog.open(str(root), JOB)
    conf = {"spark.sparkpoint.dir": str(root), "spark.sparkpoint.job": JOB,
            "spark.sparkpoint.restore": "latest", "spark.sparkpoint.commit.mode": "external"}
    expected = write_inputs(tmp_path / "input")
    first = restart(case, conf, tmp_path, "run0")
    assert first.returncode == 0, first.tail()
    latest, previous = two_newest(catalog)
    commit_pending(catalog, upto_batch=previous.batch_id)  # the audited range

    next_file = BATCHES
    for kind in KINDS:
        what = corrupt(catalog, kind, latest, previous, rng)
        bad_uri = catalog.checkpoint_uri(latest.id)
        expected += write_inputs(tmp_path / "input", files=1, start=next_file)
        next_file += 1
        run = restart(case, conf, tmp_path, f"run-{kind}")

        assert run.returncode == 0, f"{what}:\n{run.tail()}"
        assert f"skipping invalid checkpoint {bad_uri}" in run.output, f"{what}: no warning naming the path"
        assert run.result is not None
        assert run.result["restored_from"] == catalog.checkpoint_uri(previous.id), what
        assert run.result["first_batch"] == previous.batch_id + 1, what
        assert run.result["last_batch"] == next_file - 1, what
        latest, previous = two_newest(catalog)
        assert latest.batch_id == next_file - 1
        commit_pending(catalog, upto_batch=previous.batch_id)

    commit_pending(catalog)
    verdict = compare(case, expected, case.rows())
    assert verdict.exact, verdict.wrong
    assert case.leftovers(JOB) == [] and catalog.transactions() == []
    assert all(entry.valid for entry in catalog.list_checkpoints()), "corrupt checkpoints were not collected"

    # The table is at the latest batch now: the fallback is behind it. Its commits
    # recorded their offsets, so the restart replays them (runtime.replay) and goes on.
    conf["spark.sparkpoint.commit.mode"] = "checkpoint"
    latest, previous = two_newest(catalog)
    corrupt(catalog, "truncated", latest, previous, rng)
    expected += write_inputs(tmp_path / "input", files=1, start=next_file)
    next_file += 1
    healed = restart(case, conf, tmp_path, "run-sink-ahead-replayed")
    assert healed.returncode == 0, healed.tail()
    assert healed.result is not None and healed.result["recovered"]["replayed"] == [latest.batch_id], \
        healed.result
    verdict = compare(case, expected, case.rows())
    assert verdict.exact, verdict.wrong

    # A commit without its offsets (an earlier release's): falling back would duplicate
    # or lose output, so the restart is refused, and says why.
    latest, previous = two_newest(catalog)
    corrupt(catalog, "truncated", latest, previous, rng)
    assert _strip_replay_records(Path(case.output()), {latest.batch_id}) == 1
    bad_uri = catalog.checkpoint_uri(latest.id)
    generation = catalog.current_generation()
    version = _delta_version(case)
    expected += write_inputs(tmp_path / "input", files=1, start=next_file)
    refused = restart(case, conf, tmp_path, "run-sink-ahead")
    assert refused.returncode != 0
    assert ("SinkAheadError" in refused.output
            and f"already committed batch {latest.batch_id}" in refused.output), \
        refused.tail()
    assert f"batch {latest.batch_id} was committed without a replay record" in refused.output, refused.tail()
    assert f"skipping invalid checkpoint {bad_uri}" in refused.output
    assert catalog.current_generation() == generation and _delta_version(case) == version, \
        "refused, yet touched"

    rewound = restart(case, {**conf, "spark.sparkpoint.restore.sinkAhead": "rewind"}, tmp_path, "run-rewind")
    assert rewound.returncode == 0, rewound.tail()
    assert "rewound Delta table" in rewound.output
    verdict = compare(case, expected, case.rows())
    assert verdict.exact, verdict.wrong
    assert case.leftovers(JOB) == [] and catalog.transactions() == []


def _strip_replay_records(table: Path, batches: set[int]) -> int:
    """Remove the replay record from the commit info of these batches' commits (as an
    earlier release wrote them); return how many commits were changed."""
    changed = 0
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        hit = False
        for action in actions:
            info = action.get("commitInfo") or {}
            if info.get("sparkpoint.job") == JOB and int(info.get("sparkpoint.batch", -1)) in batches \
                    and info.pop("sparkpoint.replay", None) is not None:
                hit = True
        if hit:
            path.write_text("".join(json.dumps(a) + "\n" for a in actions))
            changed += 1
    return changed


def _delta_version(case: DeltaMergeCase) -> Any:
    from deltalake import DeltaTable

    return DeltaTable(case.output()).version()
