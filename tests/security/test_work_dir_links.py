"""A writer of the work directory (the live locations) or of a local store cannot make
Sparkpoint act outside it, hang it or exhaust its memory (issue #46).

Each test plants what such a writer could: a symbolic link where Sparkpoint later walks
(``offsets``, ``sources``, a state directory of the previous live location, the next
generation's ``g<N>``, an earlier ``g<N>``), a FIFO where a record is read, a sparse
file of hundreds of MiB where a small log file is read. It checks that the planted
thing was really in place when the operation ran, that the victim outside is untouched,
and that a refusal names the path.
"""

from __future__ import annotations

import os
import threading
import tracemalloc
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.exceptions import SparkpointError
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage

JOB = "orders"
HUGE = 256 * 1024 * 1024  # sparse: no disk used; old code read it whole


def outcome(action: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
    try:
        return action(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - the caller asserts what it needs
        return None, exc


def victim_dir(tmp_path: Path) -> Path:
    victim = tmp_path / "outside"
    victim.mkdir()
    (victim / "precious.txt").write_text("must survive")
    return victim


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def peak_bytes(action: Callable[[], Any]) -> tuple[int, Any, BaseException | None]:
    """The peak of Python allocations while `action` runs, and its outcome."""
    tracemalloc.start()
    try:
        result, exc = outcome(action)
        return tracemalloc.get_traced_memory()[1], result, exc
    finally:
        tracemalloc.stop()


def sparse(path: Path, size: int = HUGE) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        handle.truncate(size)


# ---------------------------------------------------------------------------- replay


def body(batch: int, sources: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"v": 1, "batch": batch, "offsets": 'v1\n{"batchWatermarkMs":0}\n{"logOffset":2}',
            "prev": None, "sources": sources or {}}


def test_replay_writes_nothing_through_a_symlinked_offsets_directory(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime import replay

    victim = victim_dir(tmp_path)
    (victim / ".2.crc").write_text("a checksum replay would unlink")
    live = tmp_path / "work" / "g2"
    live.mkdir(parents=True)
    (live / "offsets").symlink_to(victim, target_is_directory=True)
    _, exc = outcome(replay.write_batch, str(live), body(2))
    assert (live / "offsets").is_symlink(), "the planted link was gone before the replay wrote"
    assert listing(victim) == [".2.crc", "precious.txt"], \
        "replay wrote or unlinked a file outside the live location"
    assert isinstance(exc, SparkpointError) and "offsets" in str(exc), f"not refused naming offsets: {exc!r}"


def test_replay_writes_nothing_through_a_symlinked_sources_directory(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime import replay

    victim = victim_dir(tmp_path)
    (victim / "0").mkdir()
    (victim / "0" / "1").write_text("v1\n{\"path\":\"file:///outside/old\",\"batchId\":1}")
    live = tmp_path / "work" / "g2"
    (live / "offsets").mkdir(parents=True)
    (live / "sources").symlink_to(victim, target_is_directory=True)
    sources = {"0": {"entries": {"2": ['{"path":"file:///in/x","batchId":2}']}, "compact": []}}
    _, exc = outcome(replay.write_batch, str(live), body(2, sources))
    assert (live / "sources").is_symlink(), "the planted link was gone before the replay wrote"
    assert listing(victim) == ["0", "precious.txt"] and listing(victim / "0") == ["1"], \
        "replay wrote a source log entry outside the live location"
    assert isinstance(exc, SparkpointError) and "sources" in str(exc), f"not refused naming sources: {exc!r}"


# ---------------------------------------------------------------------------- materialize


def test_materialize_links_no_file_through_a_symlink_in_the_previous_live_location(tmp_path: Path) -> None:
    """``state`` of the previous location is a link to a directory outside holding a file
    of the recorded size and mtime: only the last component was checked, so it was
    hard-linked into the new location (and the next checkpoint would upload it)."""
    from airflow_sparkpoint.runtime.restore import materialize
    from tests.support.checkpointers import checkpointer
    from tests.support.fake_sinks import RecordingSink
    from tests.support.live_dirs import write_live

    catalog = Catalog(MemoryStorage(uuid.uuid4().hex), JOB)
    previous = tmp_path / "work" / "g1"
    coord = checkpointer(catalog, previous, RecordingSink(), catalog.claim_generation().generation)
    write_live(previous, 0)
    assert coord.checkpoint(0) is not None
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    victim = victim_dir(tmp_path)
    real = previous / "state" / "0" / "0" / "1.changelog"
    forged = victim / "0" / "0" / "1.changelog"
    forged.parent.mkdir(parents=True)
    forged.write_bytes(b"E" * real.stat().st_size)  # the attacker's bytes, same size and mtime
    os.utime(forged, ns=(real.stat().st_atime_ns, real.stat().st_mtime_ns))
    os.rename(previous / "state", tmp_path / "state-moved")
    (previous / "state").symlink_to(victim, target_is_directory=True)

    counts: dict[str, int] = {}
    materialize(handle, str(tmp_path / "work" / "g2"), link_from=str(previous), counts=counts)
    restored = tmp_path / "work" / "g2" / "state" / "0" / "0" / "1.changelog"
    assert (previous / "state").is_symlink(), "the planted link was gone before materialize ran"
    assert forged.stat().st_nlink == 1, "the outside file was hard-linked into the new live location"
    assert restored.read_bytes() == b"s" * 1000, "the new live location holds the attacker's bytes"
    assert counts["linked"] >= 1, "nothing was linked at all: the test exercised no link"


# ---------------------------------------------------------------------------- the g<N> locations


def test_a_planted_next_generation_location_is_not_locked_written_or_cleared(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime.restore import RestorePlan, choose_live, fill_live

    victim = victim_dir(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    (work / "g2").symlink_to(victim, target_is_directory=True)
    plan = RestorePlan(snapshot=None, description="empty")
    choice, exc = outcome(choose_live, plan, [], None, work_root=str(work), job=JOB, generation=2,
                          jvm_pid=None)
    try:
        if choice is not None:
            fill_live(choice, plan)
    finally:
        if choice is not None:
            choice.lock.release()
    assert listing(victim) == ["precious.txt"], \
        "the run locked, wrote or cleared a directory outside the work root"
    if exc is None:
        assert not (work / "g2").is_symlink() and (work / "g2").is_dir(), "the run used the planted link"
    else:
        assert "g2" in str(exc), f"the refusal does not name g2: {exc!r}"


def test_the_sweep_of_earlier_locations_locks_nothing_outside(tmp_path: Path) -> None:
    from airflow_sparkpoint.runtime import livedir

    victim = victim_dir(tmp_path)
    work = tmp_path / "work"
    (work / "g3").mkdir(parents=True)
    (work / "g1").symlink_to(victim, target_is_directory=True)
    (work / f"{livedir.TRASH_PREFIX}g0-x").symlink_to(victim, target_is_directory=True)
    outcome(livedir.remove_unowned, str(work), str(work / "g3"), 3)
    assert listing(victim) == ["precious.txt"], \
        "the sweep wrote a lock into (or deleted in) a directory outside"
    assert listing(work) == ["g3"], "the sweep left the planted links in the work root"


# ---------------------------------------------------------------------------- the local store


def test_a_fifo_planted_as_a_record_is_refused_promptly(tmp_path: Path) -> None:
    store = LocalStorage(str(tmp_path / "store"))
    (tmp_path / "store" / JOB).mkdir(parents=True)
    fifo = tmp_path / "store" / JOB / "status.json"
    os.mkfifo(fifo)
    result: list[BaseException | None] = []
    reader = threading.Thread(target=lambda: result.append(outcome(store.get, f"{JOB}/status.json", 4096)[1]),
                              daemon=True)
    reader.start()
    reader.join(5)
    hung = reader.is_alive()
    if hung:  # release the reader blocked in open(): a writer end appears, then closes
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert fifo.is_fifo()
    assert not hung, "reading a FIFO planted in the store blocked the reader"
    assert isinstance(result[0], SparkpointError) and "status.json" in str(result[0]), \
        f"not refused naming the record: {result[0]!r}"


# ------------------------------------------------------------------------- bounded reads of Spark's log files


def test_a_huge_offsets_file_in_the_snapshot_is_refused_not_read_whole(tmp_path: Path) -> None:
    """The restore's sink-position check (`replay.plan_replay`) reads the snapshot's own
    ``offsets/<batch>``: a sparse file of 256 MiB planted there in the store."""
    from airflow_sparkpoint.runtime import replay
    from tests.support.checkpointers import checkpointer
    from tests.support.fake_sinks import RecordingSink
    from tests.support.live_dirs import write_live

    store = LocalStorage(str(tmp_path / "store"))
    catalog = Catalog(store, JOB)
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), catalog.claim_generation().generation)
    write_live(live, 0)
    assert coord.checkpoint(0) is not None
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    ref = next(f for f in handle.metadata.files if f.path == "offsets/0")
    planted = tmp_path / "store" / JOB / ref.key
    assert planted.is_file(), planted
    sparse(planted)
    peak, reason, exc = peak_bytes(lambda: replay.plan_replay(handle, RecordingSink(), JOB, 1))
    assert planted.stat().st_size == HUGE
    assert peak < 64 * 1024 * 1024, f"plan_replay allocated {peak} bytes for a planted offsets file"
    assert exc is None and isinstance(reason, str) and ref.key in reason, \
        f"not refused naming the file: {reason!r}"


@pytest.mark.s3
def test_a_huge_offsets_object_in_an_s3_snapshot_is_refused_not_read_whole(seaweedfs_server: str,
                                                                          tmp_path: Path) -> None:
    """The same class on an S3 store (SeaweedFS: a server in its own process, so that
    the memory measured is the reader's alone): an object over the log-file limit is
    refused by its length, never downloaded."""
    import boto3

    from airflow_sparkpoint.checkpoints.layout import SNAPSHOT_LOG_MAX_BYTES as LOG_FILE_MAX_BYTES
    from airflow_sparkpoint.runtime import replay
    from airflow_sparkpoint.storage import open_storage
    from tests.support.checkpointers import checkpointer
    from tests.support.fake_sinks import RecordingSink
    from tests.support.live_dirs import write_live

    s3_bucket = f"sp-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=seaweedfs_server, region_name="us-east-1", aws_access_key_id="test",
                 aws_secret_access_key="test").create_bucket(Bucket=s3_bucket)
    store = open_storage(f"s3://{s3_bucket}/sp", endpoint_url=seaweedfs_server, region_name="us-east-1",
                         aws_access_key_id="test", aws_secret_access_key="test")
    catalog = Catalog(store, JOB)
    live = tmp_path / "live"
    coord = checkpointer(catalog, live, RecordingSink(), catalog.claim_generation().generation)
    write_live(live, 0)
    assert coord.checkpoint(0) is not None
    handle = catalog.handle(catalog.latest())  # type: ignore[arg-type]
    ref = next(f for f in handle.metadata.files if f.path == "offsets/0")
    handle.files_store.put(ref.key, b"v1\n" + b" " * LOG_FILE_MAX_BYTES)
    peak, reason, exc = peak_bytes(lambda: replay.plan_replay(handle, RecordingSink(), JOB, 1))
    assert handle.files_store.stat(ref.key).size > LOG_FILE_MAX_BYTES
    assert peak < LOG_FILE_MAX_BYTES, f"plan_replay allocated {peak} bytes for a planted offsets object"
    assert exc is None and isinstance(reason, str) and ref.key in reason, \
        f"not refused naming the object: {reason!r}"


@pytest.mark.parametrize("reader", ["capture", "source_log_ends", "interrupted"])
def test_a_huge_offsets_file_in_the_live_location_is_not_read_whole(tmp_path: Path, reader: str) -> None:
    from airflow_sparkpoint.runtime import livedir, replay, rescale

    live = tmp_path / "work" / "g1"
    (live / "offsets").mkdir(parents=True)
    (live / "offsets" / "3").write_text('v1\n{"batchWatermarkMs":0}\n{"logOffset":3}')
    sparse(live / "offsets" / "4")
    action: Callable[[], Any] = {
        "capture": lambda: replay.capture(str(live), 4),
        "source_log_ends": lambda: livedir.source_log_ends(str(live), 4),
        "interrupted": lambda: rescale.interrupted(str(live), 3),
    }[reader]
    peak, result, exc = peak_bytes(action)
    assert (live / "offsets" / "4").stat().st_size == HUGE
    assert peak < 64 * 1024 * 1024, f"{reader} allocated {peak} bytes for a planted offsets file"
    if reader == "capture":
        assert isinstance(result, str) and result.startswith("0:") and "offsets/4" in result, result
    elif reader == "interrupted":
        assert result is True or exc is not None, \
            "an unreadable offsets file let the location resume in place"
