"""One contract for every `Storage`: in-memory, local disk and S3 (moto over real HTTP).

Each test takes the `backend` fixture and runs once per implementation; the S3 cases
carry the ``s3`` marker. A few tests at the end hold local-only guarantees (temp files)
and `open_storage` dispatch.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.exceptions import InvalidPath, ObjectExists, ObjectNotFound, StorageError
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage, Storage, open_storage

BACKENDS = ["memory", "local", pytest.param("s3", marks=pytest.mark.s3)]
PROCESS_BACKENDS = ["local", pytest.param("s3", marks=pytest.mark.s3)]


@dataclass
class Backend:
    """A store under test plus what a test needs to reach it from elsewhere."""

    kind: str
    store: Storage
    #: picklable recipe to open the same store in another process (see `_open_spec`)
    spec: tuple[Any, ...]
    root: Path | None = None
    _open: list[Storage] = field(default_factory=list)

    def reopen(self) -> Storage:
        """An independent instance on the same root (its own client for S3)."""
        store = _open_spec(self.spec)
        self._open.append(store)
        return store

    @contextmanager
    def count_requests(self, event: str = "before-send.s3") -> Iterator[list[str]]:
        """Record the S3 operations sent while the block runs (empty for other stores)."""
        sent: list[str] = []
        if self.kind != "s3":
            yield sent
            return
        events = self.store.client.meta.events  # type: ignore[attr-defined]

        def record(**kwargs: Any) -> None:
            model = kwargs.get("model")
            sent.append(model.name if model is not None else kwargs.get("event_name", "?"))

        events.register(event, record)
        try:
            yield sent
        finally:
            events.unregister(event, record)


def _open_spec(spec: tuple[Any, ...]) -> Storage:
    kind = spec[0]
    if kind == "local":
        return LocalStorage(spec[1])
    if kind == "s3":
        from airflow_sparkpoint.storage.s3 import S3Storage

        _, bucket, prefix, endpoint = spec
        return S3Storage(bucket, prefix, endpoint_url=endpoint, region_name="us-east-1")
    if kind == "memory":
        return MemoryStorage(spec[1])
    raise AssertionError(spec)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind == "memory":
        name = f"contract-{uuid.uuid4().hex}"
        b = Backend(kind, MemoryStorage(name), ("memory", name))
    elif kind == "local":
        root = tmp_path / "store"
        b = Backend(kind, LocalStorage(str(root)), ("local", str(root)), root=root)
    else:
        endpoint = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        spec = ("s3", bucket, "contract/root", endpoint)
        b = Backend(kind, _open_spec(spec), spec)
    yield b
    for store in [b.store, *b._open]:
        store.close()
    if kind == "memory":
        MemoryStorage.reset(b.spec[1])


def _fill(store: Storage, keys: list[str], data: Callable[[str], bytes] = str.encode) -> None:
    """Write many small objects concurrently (S3 round trips dominate otherwise)."""
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(pool.map(lambda k: store.put(k, data(k)), keys))


# -- put / get ----------------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 1000, 1024 * 1024 + 7])
def test_put_get_roundtrip(backend: Backend, size: int) -> None:
    data = os.urandom(size)
    backend.store.put("job/chk-1/_metadata", data)
    assert backend.store.get("job/chk-1/_metadata") == data
    assert backend.store.exists("job/chk-1/_metadata")
    # leading and trailing slashes are the same key
    assert backend.store.get("/job/chk-1/_metadata/") == data


def test_put_overwrites_and_other_instances_see_it(backend: Backend) -> None:
    backend.store.put("k", b"one")
    backend.store.put("k", b"two")
    assert backend.store.get("k") == b"two"
    assert backend.reopen().get("k") == b"two"


def test_overwrite_is_atomic_for_concurrent_readers(backend: Backend) -> None:
    """Readers see a whole old or a whole new value, never a mix, a truncation or a gap."""
    size, rounds = (256 * 1024, 40) if backend.kind == "s3" else (1024 * 1024, 150)
    payloads = [bytes([65 + i]) * (size + i) for i in range(6)]
    valid = {p[0]: len(p) for p in payloads}
    store = backend.store
    store.put("hot/object", payloads[0])
    stop = threading.Event()
    problems: list[str] = []
    reads = [0]

    def reader() -> None:
        other = backend.reopen() if backend.kind != "memory" else store
        while not stop.is_set():
            try:
                data = other.get("hot/object")
            except Exception as exc:  # noqa: BLE001 - any failure is a contract breach here
                problems.append(f"{type(exc).__name__}: {exc}")
                return
            reads[0] += 1
            if not data or valid.get(data[0]) != len(data) or data.count(data[0]) != len(data):
                problems.append(f"partial or mixed object of {len(data)} bytes")
                return

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        for i in range(rounds):
            store.put("hot/object", payloads[i % len(payloads)])
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    assert not problems, problems[:3]
    assert reads[0] > 0


# -- put_if_absent ------------------------------------------------------------------------


def test_put_if_absent_creates_once(backend: Backend) -> None:
    backend.store.put_if_absent("gen/1", b"first")
    with pytest.raises(ObjectExists, match="gen/1"):
        backend.store.put_if_absent("gen/1", b"second")
    with pytest.raises(ObjectExists):
        backend.reopen().put_if_absent("gen/1", b"third")
    assert backend.store.get("gen/1") == b"first"


def _race_threads(store: Storage, key: str, writers: int) -> dict[int, str]:
    """`writers` threads call put_if_absent on `key` at once; returns each one's outcome."""
    barrier = threading.Barrier(writers)
    outcomes: dict[int, str] = {}

    def attempt(i: int) -> None:
        barrier.wait(timeout=30)
        try:
            store.put_if_absent(key, f"writer-{i}".encode())
            outcomes[i] = "won"
        except ObjectExists:
            outcomes[i] = "lost"
        except Exception as exc:  # noqa: BLE001 - reported by the caller
            outcomes[i] = f"error: {exc!r}"

    threads = [threading.Thread(target=attempt, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return outcomes


def test_put_if_absent_thread_race_has_exactly_one_winner(backend: Backend) -> None:
    writers = 16
    for round_ in range(3):
        key = f"race/threads-{round_}"
        outcomes = _race_threads(backend.store, key, writers)
        winners = [i for i, outcome in outcomes.items() if outcome == "won"]
        assert len(outcomes) == writers
        assert len(winners) == 1, outcomes
        assert sorted(set(outcomes.values())) == ["lost", "won"], outcomes
        assert backend.store.get(key) == f"writer-{winners[0]}".encode()


def _race_worker(spec: tuple[Any, ...], key: str, writer: int, barrier: Any, results: Any) -> None:
    """Runs in a spawned process: open the store, line up with the others, race once."""
    try:
        store = _open_spec(spec)
        if spec[0] == "s3":
            store.check()  # type: ignore[attr-defined]  # connect before the start line
        barrier.wait(timeout=120)
        try:
            store.put_if_absent(key, f"process-{writer}".encode())
            results.put((writer, "won"))
        except ObjectExists:
            results.put((writer, "lost"))
        store.close()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        results.put((writer, f"error: {exc!r}"))


@pytest.mark.parametrize("backend", PROCESS_BACKENDS, indirect=True)
def test_put_if_absent_process_race_has_exactly_one_winner(backend: Backend) -> None:
    ctx = multiprocessing.get_context("spawn")
    writers = 4
    barrier = ctx.Barrier(writers)
    results = ctx.Queue()
    key = "race/processes"
    procs = [
        ctx.Process(target=_race_worker, args=(backend.spec, key, i, barrier, results), daemon=True)
        for i in range(writers)
    ]
    for p in procs:
        p.start()
    outcomes: dict[int, str] = {}
    try:
        for _ in range(writers):
            writer, outcome = results.get(timeout=120)
            outcomes[writer] = outcome
    except queue.Empty:
        pytest.fail(f"only {len(outcomes)} of {writers} processes reported: {outcomes}")
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    winners = [w for w, outcome in outcomes.items() if outcome == "won"]
    assert len(winners) == 1, outcomes
    assert all(outcome in ("won", "lost") for outcome in outcomes.values()), outcomes
    assert backend.store.get(key) == f"process-{winners[0]}".encode()


# -- list ---------------------------------------------------------------------------------


def test_list_past_one_thousand_objects(backend: Backend) -> None:
    keys = [f"many/obj-{i:05d}" for i in range(1100)]
    _fill(backend.store, keys)
    backend.store.put("manyx/outside", b"x")
    backend.store.put("other", b"x")
    with backend.count_requests("before-call.s3.ListObjectsV2") as calls:
        listing = backend.store.list("many")
        listed = [next(listing)]
        if backend.kind == "s3":  # lazy: one page is fetched, and only once it is needed
            assert len(calls) == 1
            listed += [next(listing) for _ in range(999)]
            assert len(calls) == 1
        listed += list(listing)
    assert [info.key for info in listed] == keys
    assert all(info.size == len(info.key) for info in listed)
    if backend.kind == "s3":
        assert len(calls) == 2  # two pages of at most 1,000 keys
    assert len(list(backend.store.list())) == 1102


def test_list_is_sorted_by_key(backend: Backend, request: pytest.FixtureRequest) -> None:
    for key in ("a/x", "a-b", "a0", "b"):
        backend.store.put(key, b"1")
    assert [info.key for info in backend.store.list()] == ["a-b", "a/x", "a0", "b"]


def test_list_of_missing_prefix_is_empty(backend: Backend) -> None:
    backend.store.put("present/x", b"1")
    assert list(backend.store.list("absent")) == []
    assert backend.store.list_dirs("absent") == []


def test_list_dirs(backend: Backend) -> None:
    for key in ("d/a/1", "d/a/2", "d/b/x/1", "d/c", "dx/1", "top"):
        backend.store.put(key, b"1")
    assert backend.store.list_dirs("d") == ["a", "b"]
    assert backend.store.list_dirs("d/") == ["a", "b"]
    assert backend.store.list_dirs("d/b") == ["x"]
    assert backend.store.list_dirs("") == ["d", "dx"]
    assert backend.store.list_dirs("d/a") == []


def test_prefix_isolation(backend: Backend) -> None:
    for key in ("a/b/1", "a/b/2/deep", "a/bc/1", "a/bcd"):
        backend.store.put(key, b"1")
    assert [i.key for i in backend.store.list("a/b")] == ["a/b/1", "a/b/2/deep"]
    assert [i.key for i in backend.store.list("a/b/")] == ["a/b/1", "a/b/2/deep"]
    assert backend.store.list_dirs("a") == ["b", "bc"]
    assert backend.store.delete_prefix("a/b") == 2
    assert [i.key for i in backend.store.list("a")] == ["a/bc/1", "a/bcd"]


def test_stat_reports_size_and_mtime(backend: Backend) -> None:
    before = time.time()
    for size in (0, 1, 4096):
        backend.store.put(f"sized/{size}", b"z" * size)
        info = backend.store.stat(f"sized/{size}")
        assert info.key == f"sized/{size}"
        assert info.size == size
        assert before - 5 <= info.mtime <= time.time() + 5  # S3 has 1 s resolution
    listed = {i.key: i.size for i in backend.store.list("sized")}
    assert listed == {"sized/0": 0, "sized/1": 1, "sized/4096": 4096}


# -- delete -------------------------------------------------------------------------------


def test_batch_delete_of_more_than_one_thousand_keys(backend: Backend) -> None:
    keys = [f"del/k-{i:05d}" for i in range(1100)]
    _fill(backend.store, keys)
    backend.store.put("keep/me", b"1")
    with backend.count_requests("before-call.s3.DeleteObjects") as calls:
        backend.store.delete(iter([*keys, "del/never-existed"]))
    assert list(backend.store.list("del")) == []
    assert backend.store.get("keep/me") == b"1"
    if backend.kind == "s3":
        assert len(calls) == 2  # batches of 1,000


def test_delete_of_missing_keys_is_a_noop(backend: Backend) -> None:
    backend.store.put("x/present", b"1")
    backend.store.delete(["x/missing", "nowhere/at/all"])
    backend.store.delete([])
    backend.store.delete(["x/present", "x/present"])
    backend.store.delete(["x/present"])
    assert not backend.store.exists("x/present")


# -- copy ---------------------------------------------------------------------------------


def test_copy(backend: Backend) -> None:
    data = os.urandom(50_000)
    backend.store.put("src/state.zip", data)
    backend.store.copy("src/state.zip", "shared/ab/state.zip")
    assert backend.store.get("shared/ab/state.zip") == data
    assert backend.store.get("src/state.zip") == data
    backend.store.put("dst", b"old")
    backend.store.copy("src/state.zip", "dst")
    assert backend.store.get("dst") == data
    assert backend.store.stat("dst").size == len(data)


# -- missing objects and bad keys ---------------------------------------------------------


def test_missing_objects_raise_object_not_found(backend: Backend) -> None:
    backend.store.put("exists", b"1")
    for call in (
        lambda: backend.store.get("no/such/key"),
        lambda: backend.store.stat("no/such/key"),
        lambda: backend.store.copy("no/such/key", "dst"),
    ):
        with pytest.raises(ObjectNotFound, match="no/such/key"):
            call()
    assert not backend.store.exists("no/such/key")
    assert not backend.store.exists("dst")
    with pytest.raises(KeyError):  # ObjectNotFound is also a KeyError
        backend.store.get("no/such/key")


BAD_KEYS = ["../x", "a/../b", "a//b", "./a", "/", "", "a\\b"]


@pytest.mark.parametrize("bad", BAD_KEYS)
def test_bad_keys_are_rejected_before_any_request(backend: Backend, bad: str, tmp_path: Path) -> None:
    store = backend.store
    store.put("good", b"1")
    local_file = tmp_path / "upload.bin"
    local_file.write_bytes(b"payload")
    calls: list[Callable[[], object]] = [
        lambda: store.put(bad, b"1"),
        lambda: store.put_if_absent(bad, b"1"),
        lambda: store.get(bad),
        lambda: store.stat(bad),
        lambda: store.exists(bad),
        lambda: store.delete([bad]),
        lambda: store.copy("good", bad),
        lambda: store.copy(bad, "good2"),
        lambda: store.upload_file(str(local_file), bad),
        lambda: store.download_file(bad, str(tmp_path / "down.bin")),
    ]
    if bad not in ("", "/"):  # the empty prefix is the whole store
        calls += [lambda: list(store.list(bad)), lambda: store.list_dirs(bad)]
    with backend.count_requests() as sent:
        for call in calls:
            with pytest.raises(InvalidPath):
                call()
    assert sent == []
    assert [i.key for i in store.list()] == ["good"]
    assert not (tmp_path / "down.bin").exists()


def test_delete_validates_every_key_before_deleting_any(
    backend: Backend, request: pytest.FixtureRequest
) -> None:
    backend.store.put("keep/a", b"1")
    with pytest.raises(InvalidPath):
        backend.store.delete(["keep/a", "../escape"])
    assert backend.store.exists("keep/a")


# -- files --------------------------------------------------------------------------------


def test_upload_and_download_files(backend: Backend, tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024 + 11)
    src = tmp_path / "in.bin"
    src.write_bytes(data)
    backend.store.upload_file(str(src), "files/blob.bin")
    assert backend.store.get("files/blob.bin") == data
    target = tmp_path / "out" / "nested" / "blob.bin"
    backend.store.download_file("files/blob.bin", str(target))
    assert target.read_bytes() == data
    with pytest.raises(ObjectNotFound):
        backend.store.download_file("files/missing.bin", str(tmp_path / "out" / "missing.bin"))
    assert sorted(p.name for p in (tmp_path / "out").rglob("*") if p.is_file()) == ["blob.bin"]


def test_copy_to_another_store_and_from_a_child_view(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"  # where a streamed copy keeps its temporary file
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    data = os.urandom(2 * 1024 * 1024 + 5)
    backend.store.put("jobs/a/blob.bin", data)
    for target in (LocalStorage(str(tmp_path / "other")), MemoryStorage(f"copy-{uuid.uuid4().hex}")):
        backend.store.copy_to("jobs/a/blob.bin", target, "x/blob.bin")
        backend.store.child("jobs").copy_to("a/blob.bin", target, "y/blob.bin")
        assert target.get("x/blob.bin") == data and target.get("y/blob.bin") == data
        with pytest.raises(ObjectNotFound):
            backend.store.copy_to("jobs/a/missing.bin", target, "z")
        assert not target.exists("z")
    assert list(scratch.iterdir()) == []  # no temporary file left behind, even after a failed copy


def test_copy_from_a_view_of_itself_or_declined_without_writing(backend: Backend) -> None:
    """`copy_from` within one store (through child views, as a restore's savepoint store
    is one) copies where the store can do it in place; where it cannot it writes nothing."""
    data = os.urandom(70_000)
    backend.store.put("savepoints/sp-1/state/1.zip", data)
    source = backend.store.child("savepoints").child("sp-1")
    target = backend.store.child("job")
    copied = target.copy_from(source, "state/1.zip", "shared/1.zip~ab")
    assert copied is (backend.kind != "memory")  # memory keeps no shared place: the caller copies
    if copied:
        assert backend.store.get("job/shared/1.zip~ab") == data
        with pytest.raises(ObjectNotFound):
            target.copy_from(source, "state/missing.zip", "shared/missing~cd")
    assert [i.key for i in backend.store.list("job")] == (["job/shared/1.zip~ab"] if copied else [])
    assert backend.store.get("savepoints/sp-1/state/1.zip") == data  # the source is untouched
    foreign = MemoryStorage(f"foreign-{uuid.uuid4().hex}")
    foreign.put("k", b"1")
    assert target.copy_from(foreign, "k", "shared/k") is False
    assert not backend.store.exists("job/shared/k")


def test_child_view(backend: Backend) -> None:
    child = backend.store.child("jobs/orders")
    child.put("chk-1/_metadata", b"m")
    assert backend.store.get("jobs/orders/chk-1/_metadata") == b"m"
    assert [i.key for i in child.list()] == ["chk-1/_metadata"]
    assert child.uri == backend.store.uri.rstrip("/") + "/jobs/orders"


# -- local-only guarantees ----------------------------------------------------------------


def _leftover_temp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if ".sparkpoint-tmp" in p.name]


def test_local_copy_from_is_a_hard_link_and_each_name_stays_immutable(tmp_path: Path) -> None:
    savepoint = LocalStorage(str(tmp_path / "root" / "savepoints" / "sp-1"))
    job = LocalStorage(str(tmp_path / "root" / "job"))
    savepoint.put("state/1.zip", b"v1")
    assert job.copy_from(savepoint, "state/1.zip", "shared/1.zip~ab") is True
    linked, original = tmp_path / "root/job/shared/1.zip~ab", tmp_path / "root/savepoints/sp-1/state/1.zip"
    assert linked.stat().st_ino == original.stat().st_ino and linked.stat().st_nlink == 2
    # Writes replace a name, never the file: the other name keeps its bytes.
    job.put("shared/1.zip~ab", b"v2")
    assert savepoint.get("state/1.zip") == b"v1" and job.get("shared/1.zip~ab") == b"v2"
    savepoint.delete(["state/1.zip"])
    assert job.get("shared/1.zip~ab") == b"v2"
    assert _leftover_temp_files(tmp_path) == []


def test_local_put_if_absent_leaves_no_temp_files(tmp_path: Path) -> None:
    store = LocalStorage(str(tmp_path / "store"))
    store.put_if_absent("gen/1", b"a")
    with pytest.raises(ObjectExists):
        store.put_if_absent("gen/1", b"b")
    store.put("gen/2", b"c")
    assert _leftover_temp_files(tmp_path) == []
    assert sorted(p.name for p in (tmp_path / "store" / "gen").iterdir()) == ["1", "2"]


def test_local_crash_mid_write_is_invisible(tmp_path: Path) -> None:
    store = LocalStorage(str(tmp_path / "store"))
    store.put("job/chk-1/_metadata", b"done")
    # what a writer killed between "write temp file" and "rename" leaves behind
    half = tmp_path / "store" / "job" / "chk-2" / ".sparkpoint-tmp-deadbeef"
    half.parent.mkdir(parents=True)
    half.write_bytes(b"half a metad")
    beside = tmp_path / "store" / "job" / "chk-1" / ".sparkpoint-tmp-cafe"
    beside.write_bytes(b"partial")
    assert [i.key for i in store.list()] == ["job/chk-1/_metadata"]
    assert [i.key for i in store.list("job/chk-2")] == []
    assert not store.exists("job/chk-2/_metadata")


# -- open_storage dispatch ----------------------------------------------------------------


def test_open_storage_dispatches_local_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plain = open_storage(str(tmp_path / "plain"))
    assert isinstance(plain, LocalStorage)
    assert plain.uri == f"file://{tmp_path / 'plain'}"
    monkeypatch.chdir(tmp_path)
    relative = open_storage("rel/dir")
    assert isinstance(relative, LocalStorage) and relative.root == str(tmp_path / "rel" / "dir")
    url = open_storage(f"file://{tmp_path}/viaurl")
    assert isinstance(url, LocalStorage) and url.root == str(tmp_path / "viaurl")
    url.put("k", b"v")
    assert (tmp_path / "viaurl" / "k").read_bytes() == b"v"


def test_open_storage_dispatches_memory() -> None:
    name = f"dispatch-{uuid.uuid4().hex}"
    root = open_storage(f"memory://{name}")
    assert isinstance(root, MemoryStorage)
    sub = open_storage(f"memory://{name}/jobs/a")
    sub.put("x", b"1")
    assert root.get("jobs/a/x") == b"1"
    MemoryStorage.reset(name)


@pytest.mark.parametrize("scheme", ["s3", "s3a", "s3n"])
def test_open_storage_dispatches_s3_without_touching_the_network(scheme: str) -> None:
    from airflow_sparkpoint.storage.s3 import S3Storage

    store = open_storage(f"{scheme}://my-bucket/sp/root/", endpoint_url="http://127.0.0.1:9", max_attempts=1)
    assert isinstance(store, S3Storage)
    assert store.uri == "s3://my-bucket/sp/root"
    assert store.bucket == "my-bucket" and store.prefix == "sp/root/"
    assert store.connection._client is None  # created lazily


@pytest.mark.s3
def test_open_storage_s3_roundtrip(s3_server: str, s3_bucket: str) -> None:
    store = open_storage(f"s3a://{s3_bucket}/via/open", endpoint_url=s3_server)
    store.put("k", b"v")
    again = open_storage(f"s3://{s3_bucket}", endpoint_url=s3_server)
    assert again.get("via/open/k") == b"v"
    store.close()
    again.close()


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("", ""),
        ("   ", "   "),
        ("s3://", "s3://"),
        ("s3:///prefix", "s3:///prefix"),
        ("ftp://x", "ftp://x"),
        ("hdfs://nn/x", "hdfs://nn/x"),
        ("file://host/x", "file://host/x"),
        ("s3://Bad_Bucket/x", "Bad_Bucket"),
        ("s3://ab/x", "ab"),
        ("s3://bucket/../x", "../x"),
        ("s3://bucket/a//b", "a//b"),
    ],
)
def test_open_storage_rejects_malformed_uris(uri: str, named: str) -> None:
    with pytest.raises(InvalidPath) as info:
        open_storage(uri)
    assert repr(named) in str(info.value)


def test_storage_errors_form_one_tree() -> None:
    assert issubclass(ObjectNotFound, StorageError) and issubclass(ObjectExists, StorageError)
    assert issubclass(InvalidPath, StorageError) and issubclass(InvalidPath, ValueError)


def test_a_usable_store_passes_its_declared_checks_and_so_does_a_view_of_it(backend: Backend) -> None:
    for store in (backend.store, backend.store.child("view")):
        store.check()
        store.check_exclusive_create()
        assert not store.exists("_sparkpoint_probe")  # the checks leave nothing behind
