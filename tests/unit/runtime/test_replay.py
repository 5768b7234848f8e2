"""`runtime.replay` without Spark: what a commit records, when a replay is proven exact
(and why not), and the Spark log files it writes back (including a compacted file
source log)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from airflow_sparkpoint.runtime import replay
from airflow_sparkpoint.storage.localfs import Dir
from tests.support.fake_sinks import PositionedReplaySink
from tests.support.fake_sinks import ReplayRecordSink as FakeSink
from tests.support.replay_lives import entry, live, offsets_text, snapshot_at


def test_a_record_holds_the_offsets_the_previous_hash_and_the_file_source_entries(tmp_path: Path) -> None:
    root = live(tmp_path, 3)
    body = replay.decode(replay.capture(str(root), 2))
    assert isinstance(body, dict)
    assert body["offsets"] == (root / "offsets" / "2").read_text()
    assert body["prev"] == replay._sha((root / "offsets" / "1").read_text())
    assert body["sources"] == {"0": {"entries": {"2": [entry("file:///in/f2.json", 2)]}, "compact": []}}


def test_a_batch_that_cannot_be_recorded_says_why(tmp_path: Path) -> None:
    root = live(tmp_path, 3)
    os.unlink(root / "sources" / "0" / "2")
    assert replay.decode(replay.capture(str(root), 2)) == "sources/0/2 was not in the live checkpoint"
    assert replay.decode(replay.capture(str(root), 7)) == "offsets/7 was not in the live checkpoint"


def test_the_replay_is_proven_from_the_restart_point_and_replayed_byte_for_byte(tmp_path: Path) -> None:
    root = live(tmp_path, 4)
    records = {n: replay.capture(str(root), n) for n in range(4)}
    plan = replay.plan_replay(snapshot_at(root, 1), FakeSink(records), "job", 3)  # type: ignore[arg-type]
    assert isinstance(plan, replay.ReplayPlan) and (plan.first, plan.last) == (2, 3)

    fresh = tmp_path / "fresh"  # the restart point's files only, as materialized
    for sub in ("offsets", "sources/0"):
        (fresh / sub).mkdir(parents=True)
        for n in (0, 1):
            (fresh / sub / str(n)).write_text((root / sub / str(n)).read_text())
    (fresh / "offsets" / ".2.crc").write_text("stale")
    for body in plan.records:
        replay.write_batch(str(fresh), body)
    for sub in ("offsets", "sources/0"):
        for n in (2, 3):
            assert (fresh / sub / str(n)).read_text() == (root / sub / str(n)).read_text()
    assert not (fresh / "offsets" / ".2.crc").exists(), "a stale checksum would fail Spark's read"


def test_a_compacted_source_log_is_recorded_and_rebuilt(tmp_path: Path) -> None:
    root = live(tmp_path, 11, compact_at=9)
    body = replay.decode(replay.capture(str(root), 9))
    assert isinstance(body, dict) and body["sources"]["0"]["compact"] == [9]
    fresh = tmp_path / "fresh"
    (fresh / "sources" / "0").mkdir(parents=True)
    for n in range(9):
        (fresh / "sources" / "0" / str(n)).write_text((root / "sources" / "0" / str(n)).read_text())
    replay.write_batch(str(fresh), body)
    compact = Path("sources") / "0" / "9.compact"
    assert (fresh / compact).read_text() == (root / compact).read_text()


def test_unknown_offsets_are_refused_with_the_reason(tmp_path: Path) -> None:
    root = live(tmp_path, 4)
    records: dict[int, str | None] = {n: replay.capture(str(root), n) for n in range(4)}
    snapshot = snapshot_at(root, 1)

    def why(recs: dict[int, str | None], snap: Any = snapshot) -> Any:
        return replay.plan_replay(snap, FakeSink(recs), "job", 3)  # type: ignore[arg-type]

    assert "batch 3 was committed without a replay record" in why({**records, 3: None})
    assert ("offsets/2 was not in the live checkpoint"
            in why({**records, 2: "0:offsets/2 was not in the live checkpoint"}))
    other = live(tmp_path / "other", 2)  # another run's batch 1: same source offset, other batch
    (other / "offsets" / "1").write_text(offsets_text(7, json.dumps({"logOffset": 1})))
    assert "did not start from the restart point (batch 1)" in why(records, snapshot_at(other, 1))

    # A rate, socket or memory source: a bare counter, its input is not kept.
    (root / "offsets" / "2").write_text(offsets_text(2, json.dumps({"logOffset": 2}), "17"))
    counter = {**records, 2: replay.capture(str(root), 2)}
    assert "source 1 of batch 2 has a counter offset (17)" in why(counter)

    # Structured offsets (Kafka, a Python data source) are re-read by range; from empty
    # state their own log would be needed.
    (root / "offsets" / "0").write_text(offsets_text(0, '{"topic":{"0":5}}'))
    kafka = {0: replay.capture(str(root), 0)}
    assert "replaying it from empty state" in replay.plan_replay(None, FakeSink(kafka), "job", 0)  # type: ignore[arg-type,operator]
    (root / "offsets" / "1").write_text(offsets_text(1, '{"topic":{"0":9}}'))
    kafka[1] = replay.capture(str(root), 1)
    assert isinstance(replay.plan_replay(snapshot_at(root, 0), FakeSink(kafka), "job", 1),  # type: ignore[arg-type]
                      replay.ReplayPlan)


def test_kafka_offsets_of_several_partitions_replay_also_when_a_partition_appears_between_batches(
    tmp_path: Path,
) -> None:
    # {"topic": {"<partition>": offset}}: partition 2 first appears in batch 2; the file
    # source beside it keeps its own log, recorded as before.
    root = live(tmp_path, 4)
    kafka = ['{"events":{"0":2,"1":2}}', '{"events":{"0":4,"1":3}}', '{"events":{"0":4,"1":3,"2":1}}',
             '{"events":{"0":5,"1":3,"2":3}}']
    for n, offsets in enumerate(kafka):
        (root / "offsets" / str(n)).write_text(offsets_text(n, json.dumps({"logOffset": n}), offsets))
    records = {n: replay.capture(str(root), n) for n in range(4)}
    plan = replay.plan_replay(snapshot_at(root, 1), FakeSink(records), "job", 3)  # type: ignore[arg-type]

    assert isinstance(plan, replay.ReplayPlan), plan
    assert (plan.first, plan.last) == (2, 3)
    assert [body["offsets"].splitlines()[-1] for body in plan.records] == kafka[2:]
    assert [sorted(body["sources"]) for body in plan.records] == [["0"], ["0"]]  # the file source alone
    fresh = tmp_path / "fresh"
    for body in plan.records:
        replay.write_batch(str(fresh), body)
    assert ([(fresh / "offsets" / str(n)).read_text() for n in (2, 3)]
            == [(root / "offsets" / str(n)).read_text() for n in (2, 3)])
    # from empty state the structured offsets have no log to start from
    assert "source 1 of batch 0 is not a file source" in replay.plan_replay(  # type: ignore[operator]
        None, FakeSink(records), "job", 3)  # type: ignore[arg-type]


def test_check_sink_position_replays_only_for_restore_latest_and_says_why_not(tmp_path: Path) -> None:
    import pytest

    from airflow_sparkpoint.exceptions import SinkAheadError
    from airflow_sparkpoint.runtime.restore import RestorePlan, check_sink_position

    root = live(tmp_path, 2)

    sink = PositionedReplaySink({n: replay.capture(str(root), n) for n in range(2)})
    # restore=latest, empty state (every checkpoint lost): the sink's batches 0..1 replay
    assert check_sink_position(RestorePlan(None, "empty", latest=True), sink, "job") is False  # type: ignore[arg-type]
    with pytest.raises(SinkAheadError, match="already committed batch 1") as refused:  # an explicit restore
        check_sink_position(RestorePlan(None, "empty"), sink, "job")  # type: ignore[arg-type]
    assert "cannot be replayed" not in str(refused.value)
    sink.records[1] = None
    with pytest.raises(SinkAheadError, match="batch 1 was committed without a replay record"):
        check_sink_position(RestorePlan(None, "empty", latest=True), sink, "job")  # type: ignore[arg-type]


def test_a_lineage_with_the_rewind_policy_replays_where_the_sink_cannot_be_rewound(tmp_path: Path) -> None:
    """Found by the long exploration (seed 20261129, schedule 7394): a start with
    restore=none and sinkAhead=rewind wrote its origin, then a superseded run's commit in
    flight landed batch 0; the start was refused, and so was every restore=latest after it:
    the lineage's inherited rewind policy skipped the exact replay, and a directory sink
    (or empty state) cannot be rewound. A replay is tried wherever no rewind can happen."""
    import pytest

    from airflow_sparkpoint.exceptions import SinkAheadError
    from airflow_sparkpoint.runtime.restore import RestorePlan, check_sink_position

    root = live(tmp_path, 2)

    sink = PositionedReplaySink({n: replay.capture(str(root), n) for n in range(2)})
    plan = RestorePlan(None, "empty", sink_ahead="rewind", latest=True)
    assert plan.replays_ahead(sink)
    assert check_sink_position(plan, sink, "job") is False  # type: ignore[arg-type]
    with pytest.raises(SinkAheadError, match="cannot rewind"):  # an explicit restore is still refused
        check_sink_position(RestorePlan(None, "empty", sink_ahead="rewind"), sink, "job")  # type: ignore[arg-type]
    sink.can_rewind = True
    assert plan.replays_ahead(sink), "empty state: nothing to rewind to"
    assert not RestorePlan(snapshot_at(root, 0), "chk", sink_ahead="rewind", latest=True).replays_ahead(
        sink), "a rewindable sink and a snapshot: the rewind the policy asks for"


def test_batches_are_replayed_only_by_the_code_version_that_committed_them(tmp_path: Path) -> None:
    """Found by the long exploration (seed 20261130, schedule 74): a retry of other job code
    (v1) replayed batch 1, committed by v3, so its state (a running sum of amount * version)
    was not the one the committed output came from, and every later row was wrong. With
    `spark.sparkpoint.codeVersion` each commit records its code, and a replay by another
    version is refused with the reason."""
    from airflow_sparkpoint.runtime.config import SparkpointConfig

    root = live(tmp_path, 2)

    sink = PositionedReplaySink({n: replay.capture(str(root), n, "v3") for n in range(2)})
    assert isinstance(replay.plan_replay(None, sink, "job", 1, "v3"), replay.ReplayPlan)
    refused = replay.plan_replay(None, sink, "job", 1, "v1")
    assert isinstance(refused, str) and "batch 0 was committed by job code version v3" in refused
    assert "this run is version v1" in refused
    undeclared = replay.plan_replay(None, sink, "job", 1)
    assert isinstance(undeclared, str) and "(none declared)" in undeclared

    config = SparkpointConfig.from_conf({"spark.sparkpoint.dir": str(tmp_path), "spark.sparkpoint.job": "job",
                                         "spark.sparkpoint.codeVersion": " 2026.11-abc "})
    assert config.code_version == "2026.11-abc"
    import pytest

    from airflow_sparkpoint.exceptions import ConfigError

    with pytest.raises(ConfigError, match=r"codeVersion='a\\nb' is invalid; expected up to 128 printable"):
        SparkpointConfig.from_conf({"spark.sparkpoint.dir": str(tmp_path), "spark.sparkpoint.job": "job",
                                    "spark.sparkpoint.codeVersion": "a\nb"})


def test_the_entries_of_a_compaction_batch_are_found_without_parsing_the_whole_log(tmp_path: Path,
                                                                                    monkeypatch: Any) -> None:
    """A file source's compact file holds every entry since the job began (issue 32: a job of
    weeks, millions of lines): a compaction batch's record parses only its own lines."""
    history = [entry(f"file:///in/old-{n}.json", n % 5) for n in range(20_000)]
    mine = [entry("file:///in/a.json", 5), entry('file:///in/"batchId":5.json', 5)]
    tricky = entry("file:///in/later.json", 55)  # starts like batch 5's id; not one of its entries
    text = "\n".join(["v1", *history, mine[0], tricky, mine[1]])
    parsed: list[str] = []
    loads = json.loads
    monkeypatch.setattr(replay.json, "loads", lambda s, *a, **kw: parsed.append(s) or loads(s, *a, **kw))

    (tmp_path / "5.compact").write_text(text)
    with Dir.open(str(tmp_path)) as root:
        assert replay._compacted_lines(root, "5.compact", 5) == mine
        assert len(parsed) == 3, "only the lines holding the batch's id are parsed"

        spaced = "\n".join(["v1", *(json.dumps(json.loads(line)) for line in [*history[:50], *mine])])
        (tmp_path / "spaced.compact").write_text(spaced)
        assert [json.loads(line) for line in replay._compacted_lines(root, "spaced.compact", 5)] == \
            [json.loads(m) for m in mine], "another writer's spacing: every line is parsed"


def test_a_compaction_batch_reads_only_the_end_of_the_compact_file(tmp_path: Path, monkeypatch: Any) -> None:
    """Spark appends a compaction batch's own entries after every earlier one, so its record
    reads ``k.compact`` backwards from the end to the first entry of an earlier batch (issue
    32: a job of weeks has millions of lines before them); a compaction batch of no file
    parses no more than one line either."""
    directory = tmp_path / "sources" / "0"
    directory.mkdir(parents=True)
    history = [entry(f"file:///in/old-{n:06d}.json", n // 3) for n in range(60_000)]  # batches 0..19999
    mine = [entry("file:///in/a.json", 20_000), entry("file:///in/é.json", 20_000)]
    (directory / "20000.compact").write_text("\n".join(["v1", *history, *mine]) + "\n", encoding="utf-8")
    # no file of its own
    (directory / "20001.compact").write_text("\n".join(["v1", *history]), encoding="utf-8")
    read_whole: list[str] = []
    read_text = replay._read_text
    monkeypatch.setattr(replay, "_read_text", lambda root, path: read_whole.append(path)
                        or read_text(root, path))
    parsed: list[Any] = []
    loads = json.loads
    monkeypatch.setattr(replay.json, "loads", lambda s, *a, **kw: parsed.append(s) or loads(s, *a, **kw))

    with Dir.open(str(tmp_path)) as root:
        assert replay._log_entries(root, "sources/0", 20_000) == (mine, True)
        assert replay._log_entries(root, "sources/0", 20_001) == ([], True)
    assert [p for p in read_whole if p.endswith(".compact")] == [], "no compact file is read whole"
    assert len(parsed) == 4, "the batch's own lines and the one before them, in each file"


def test_a_compact_file_that_does_not_end_with_its_batch_is_read_whole(tmp_path: Path) -> None:
    """Another writer's order (a later batch's entry among the last lines): the record falls
    back to reading the whole file, and still holds exactly the batch's entries."""
    directory = tmp_path / "sources" / "0"
    directory.mkdir(parents=True)
    lines = [entry("file:///in/x.json", 4), entry("file:///in/a.json", 5), entry("file:///in/later.json", 6),
             entry("file:///in/b.json", 5)]
    (directory / "5.compact").write_text("\n".join(["v1", *lines]), encoding="utf-8")
    with Dir.open(str(tmp_path)) as root:
        assert replay._log_entries(root, "sources/0", 5) == ([lines[1], lines[3]], True)


def test_a_compaction_batch_of_many_files_is_read_back_past_the_first_window(tmp_path: Path) -> None:
    """A batch whose entries take more than the first window read from the end: the window
    grows until an entry of an earlier batch is in it."""
    directory = tmp_path / "sources" / "0"
    directory.mkdir(parents=True)
    history = [entry(f"file:///in/old-{n}.json", n) for n in range(9)]
    mine = [entry(f"file:///in/many-{n:05d}-{'x' * 40}.json", 9) for n in range(3_000)]  # ≈ 270 KB
    (directory / "9.compact").write_text("\n".join(["v1", *history, *mine]), encoding="utf-8")
    (directory / "10.compact").write_text("\n".join(["v1", *mine]), encoding="utf-8")
    with Dir.open(str(directory)) as root:
        assert replay._compacted_tail(root, "9.compact", 9) == mine
        assert replay._compacted_tail(root, "9.compact", 8) is None, "batch 9's entries follow batch 8's"
        assert replay._compacted_tail(root, "10.compact", 9) == mine, "the whole file is the batch's"
