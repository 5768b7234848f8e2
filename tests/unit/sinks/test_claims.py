"""The claim protocol of the file sinks (`_claims`) at the storage level, against the
in-memory store, a local directory and S3 (moto over HTTP; SeaweedFS too, ``slow``): exclusive promotion per
batch, commit against abort of one transaction, roll-forward of a dead claimant, and the
readers' view. The sink is a small real one (`fake_sinks.CopySink`): staged objects under
``_staging/<txn>/`` are copied to ``part-<txn>-<n>`` on promotion, the way `DirectorySink`
promotes on S3.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.exceptions import SinkError, TransactionConflict
from airflow_sparkpoint.sinks import _claims as claims
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.base import CommittedTxn
from airflow_sparkpoint.storage import LocalStorage, MemoryStorage, Storage
from tests.support.deaths import Died, dies_at
from tests.support.fake_sinks import COPY_FILES, CopySink
from tests.support.records import transaction_record

JOB = "orders"  # CopySink.job
FILES = COPY_FILES  # what CopySink stages per batch


def files_of(txn: str, n: int = FILES) -> list[str]:
    return [f"part-{txn}-{i:05d}" for i in range(n)]


# -- stores -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def seaweedfs_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tests.support.s3_servers import SeaweedFS

    with SeaweedFS(tmp_path_factory.mktemp("seaweedfs")) as server:
        yield server.endpoint


@pytest.fixture(params=["memory", "local", pytest.param("s3", marks=pytest.mark.s3),
                        pytest.param("seaweedfs", marks=[pytest.mark.s3, pytest.mark.slow])])
def store_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    """Independent `Storage` instances on one root (S3: each with its own client): the
    in-memory store, a local directory, moto over HTTP, SeaweedFS (``slow``)."""
    request.node.rounds = 3 if request.param == "s3" else 10  # moto in this process is slow
    if request.param == "memory":
        name = f"claims-{uuid.uuid4().hex[:8]}"
        yield lambda: MemoryStorage(name)
        MemoryStorage.reset(name)
    elif request.param == "local":
        yield lambda: LocalStorage(str(tmp_path / "dest"))
    else:
        import boto3

        from airflow_sparkpoint.storage.s3 import S3Storage

        endpoint = request.getfixturevalue("s3_server" if request.param == "s3" else "seaweedfs_endpoint")
        bucket = f"sp-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
        yield lambda: S3Storage(bucket, "dest", endpoint_url=endpoint, region_name="us-east-1")


@pytest.fixture()
def store(store_factory: Callable[[], Storage]) -> Storage:
    return store_factory()


# -- one claimant ------------------------------------------------------------------------


def test_commit_claims_before_promoting_and_marks_done(store: Storage) -> None:
    seen: list[dict[str, Any] | None] = []
    sink = CopySink(store, hook=lambda step: seen.append(manifests.read_manifest(store, JOB, 4)))
    record = sink.stage_batch(4, 1)

    outcome = sink.commit(record)

    assert (outcome.status == "committed"
            and outcome.detail == {"files": 3, "bytes": sum(len(f"{record.txn_id}:{i}")
                                                            for i in range(3))})
    # the claim existed, naming the transaction and its files, before the first file appeared
    assert seen[0] is not None and seen[0]["txn_id"] == record.txn_id and seen[0]["state"] == "promoting"
    assert [f["path"] for f in seen[0]["files"]] == files_of(record.txn_id)
    claim = manifests.read_manifest(store, JOB, 4)
    assert claim is not None and claim["state"] == "done" and claim["generation"] == 1
    assert sink.visible() == files_of(record.txn_id) and sink.staged() == []
    assert claims.is_committed(store, record)
    assert claims.committed_txn(store, JOB, 4) == CommittedTxn(JOB, 4, 1, record.txn_id)
    assert manifests.committed_position(store, JOB) == 4
    assert sink.commit(record).status == "already"


def test_a_second_transaction_of_the_batch_loses_and_its_data_is_discarded(store: Storage) -> None:
    sink = CopySink(store)
    first, second = sink.stage_batch(0, 1), sink.stage_batch(0, 2)
    sink.commit(first)

    with pytest.raises(TransactionConflict) as info:
        sink.commit(second)

    message = str(info.value)
    assert "batch 0" in message and "'orders-b0-g1'" in message and "generation 1" in message
    assert "'orders-b0-g2'" in message and "generation 2" in message
    assert sink.visible() == files_of(first.txn_id)
    assert sink.staged() == []
    assert not claims.is_committed(store, second)
    sink.abort(second)  # idempotent: nothing of it is left
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(first)


def test_an_abort_that_wins_keeps_the_transaction_from_ever_claiming(store: Storage) -> None:
    """The zombie case: the newer generation's recovery aborts T before T's stalled
    committer wakes; T must not claim the batch, which stays free for the re-run."""
    sink = CopySink(store)
    zombie = sink.stage_batch(2, 1)
    sink.abort(zombie)
    assert sink.staged() == []

    with pytest.raises(SinkError, match="was aborted") as info:
        sink.commit(zombie)
    assert not isinstance(info.value, TransactionConflict)
    assert manifests.read_manifest(store, JOB, 2) is None and sink.visible() == []

    rerun = sink.stage_batch(2, 2)
    assert sink.commit(rerun).status == "committed"
    assert sink.visible() == files_of(rerun.txn_id)
    with pytest.raises(TransactionConflict):  # the zombie, waking after the re-run promoted
        sink.commit(zombie)
    assert sink.visible() == files_of(rerun.txn_id)


def test_a_committer_that_died_after_deciding_is_finished_by_the_aborter(store: Storage) -> None:
    sink = CopySink(store)
    record = sink.stage_batch(1, 1)
    plan, files = sink._plan(record)
    claims.decide(store, claims.decision_key(JOB, record.txn_id),
                  claims._decision(record, claims.PROMOTE, plan, files))  # ... and died before its claim

    with pytest.raises(SinkError, match="has committed"):
        sink.abort(record)

    assert claims.is_committed(store, record)
    assert sink.visible() == files_of(record.txn_id) and sink.staged() == []
    assert manifests.read_manifest(store, JOB, 1)["state"] == "done"  # type: ignore[index]


def test_a_decided_transaction_that_lost_the_claim_is_aborted_with_its_own_data_only(store: Storage) -> None:
    sink = CopySink(store)
    loser, winner = sink.stage_batch(1, 1), sink.stage_batch(1, 2)
    plan, files = sink._plan(loser)
    claims.decide(store, claims.decision_key(JOB, loser.txn_id),
                  claims._decision(loser, claims.PROMOTE, plan, files))
    sink.commit(winner)

    sink.abort(loser)

    assert sink.visible() == files_of(winner.txn_id) and sink.staged() == []


@pytest.mark.parametrize("step", ["promoted 1", "promoted 2", "promoted 3"])
def test_a_claimant_that_died_halfway_is_rolled_forward(store: Storage, step: str) -> None:
    dying = CopySink(store, hook=dies_at(step))
    record = dying.stage_batch(3, 1)
    with pytest.raises(Died):
        dying.commit(record)
    assert claims.is_committed(store, record)  # decided: committed, if unfinished
    assert manifests.committed_position(store, JOB) == 3

    sink = CopySink(store)
    with pytest.raises(TransactionConflict):  # a re-run of the batch never gets in
        sink.commit(sink.stage_batch(3, 2))
    assert sink.commit(record).status == "committed"  # the next commit of it finishes it
    assert sink.visible() == files_of(record.txn_id) and sink.staged() == []
    assert manifests.read_manifest(store, JOB, 3)["state"] == "done"  # type: ignore[index]


@pytest.mark.parametrize("finisher", ["abort", "orphan"])
def test_an_unfinished_claim_is_finished_by_abort_or_cleanup_never_aborted(
    store: Storage, finisher: str
) -> None:
    dying = CopySink(store, hook=dies_at("promoted 1"))
    record = dying.stage_batch(5, 1)
    with pytest.raises(Died):
        dying.commit(record)

    sink = CopySink(store)
    if finisher == "abort":
        with pytest.raises(SinkError, match="has committed"):
            sink.abort(record)
    else:
        assert claims.settle_orphan(sink, record.txn_id) == "committed"

    assert sink.visible() == files_of(record.txn_id) and sink.staged() == []


def test_orphans_without_a_claim_are_discarded_and_cannot_claim_afterwards(store: Storage) -> None:
    sink = CopySink(store)
    record = sink.stage_batch(6, 1)

    assert claims.settle_orphan(sink, record.txn_id) == "discarded"

    assert sink.staged() == []
    with pytest.raises(SinkError, match="was aborted"):
        sink.commit(record)


def test_lost_staged_data_of_a_claim_is_an_error_not_a_silent_release(store: Storage) -> None:
    dying = CopySink(store, hook=dies_at("promoted 1"))
    record = dying.stage_batch(7, 1)
    with pytest.raises(Died):
        dying.commit(record)
    store.delete([f"_staging/{record.txn_id}/2"])  # e.g. a lifecycle rule

    with pytest.raises(SinkError, match="lost"):
        CopySink(store).commit(record)
    assert claims.is_committed(store, record)  # the claim stays: only a person may remove it


def test_staged_data_lost_before_the_claim_leaves_the_batch_free(store: Storage) -> None:
    sink = CopySink(store)
    record = sink.stage_batch(8, 1)
    store.delete([f"_staging/{record.txn_id}/1"])  # e.g. a lifecycle rule, before the commit

    with pytest.raises(SinkError, match="nothing was claimed"):
        sink.commit(record)

    assert manifests.read_manifest(store, JOB, 8) is None and sink.visible() == []
    sink.abort(record)
    rerun = sink.stage_batch(8, 2)
    assert sink.commit(rerun).status == "committed" and sink.visible() == files_of(rerun.txn_id)


def test_manifests_of_the_previous_release_count_as_done_claims(store: Storage) -> None:
    old = {"schema_version": 1, "job": JOB, "batch_id": 9, "generation": 4, "txn_id": "orders-b9-g4",
           "sink_id": store.uri, "format": "bin", "files": [{"path": "part-orders-b9-g4-00000", "size": 1}]}
    store.put(manifests.manifest_key(JOB, 9), json.dumps(old).encode())
    sink = CopySink(store)
    record = transaction_record(sink, 9, 4, {"files": []}, job=JOB)

    assert claims.is_committed(store, record) and manifests.committed_position(store, JOB) == 9
    assert sink.commit(record).status == "already"
    with pytest.raises(SinkError, match="has committed"):
        sink.abort(record)
    with pytest.raises(TransactionConflict):
        sink.commit(sink.stage_batch(9, 5))
    assert [c["state"] for c in claims.committed_batches(store, JOB)] == ["done"]


def test_readers_see_only_batches_whose_promotion_is_done(store: Storage) -> None:
    sink = CopySink(store)
    done = sink.stage_batch(0, 1)
    sink.commit(done)
    dying = CopySink(store, hook=dies_at("promoted 1"))
    with pytest.raises(Died):
        dying.commit(dying.stage_batch(1, 1))

    batches = claims.committed_batches(store, JOB)

    assert [(c["batch_id"], c["state"]) for c in batches] == [(0, "done"), (1, "promoting")]
    assert [f["path"] for f in batches[0]["files"]] == files_of(done.txn_id)


# -- races ------------------------------------------------------------------------------


def _race(*calls: Callable[[], str]) -> list[str]:
    """Run `calls` at once (released together, with a little jitter); their results."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], str]) -> str:
        barrier.wait()
        time.sleep(random.uniform(0, 0.02))
        return call()

    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(run, calls))


def _commit(sink: CopySink, record: TransactionRecord) -> Callable[[], str]:
    def call() -> str:
        try:
            sink.commit(record)
        except TransactionConflict:
            return "lost"
        except SinkError:
            return "refused"
        return "committed"
    return call


def _abort(sink: CopySink, record: TransactionRecord) -> Callable[[], str]:
    def call() -> str:
        try:
            sink.abort(record)
        except SinkError:
            return "refused"
        return "aborted"
    return call


def test_concurrent_transactions_of_one_batch_promote_exactly_once(
    store_factory: Callable[[], Storage], request: pytest.FixtureRequest
) -> None:
    racers = 4
    for batch in range(request.node.rounds):
        sinks = [CopySink(store_factory()) for _ in range(racers)]
        records = [s.stage_batch(batch, g + 1) for g, s in enumerate(sinks)]

        outcomes = _race(*(_commit(s, r) for s, r in zip(sinks, records, strict=True)))

        assert outcomes.count("committed") == 1 and outcomes.count("lost") == racers - 1, outcomes
        winner = records[outcomes.index("committed")]
        view = CopySink(store_factory())
        assert [k for k in view.visible() if f"-b{batch}-" in k] == files_of(winner.txn_id)
        assert [k for k in view.staged() if f"-b{batch}-" in k] == []


def test_commit_against_abort_of_one_transaction_is_all_or_nothing(
    store_factory: Callable[[], Storage], request: pytest.FixtureRequest
) -> None:
    """A stalled committer against the newer generation's recovery, raced many times: the
    transaction ends fully committed (the abort refused) or fully aborted (the commit
    refused), never with part of its files visible or its data deleted under a claim."""
    for batch in range(request.node.rounds):
        committer, aborter = CopySink(store_factory()), CopySink(store_factory())
        record = committer.stage_batch(batch, 1)

        committed_by, aborted_by = _race(_commit(committer, record), _abort(aborter, record))

        assert (committed_by, aborted_by) in {("committed", "refused"), ("refused", "aborted")}
        view = CopySink(store_factory())
        committed = claims.is_committed(view.store, record)
        assert committed == (committed_by == "committed")
        assert ([k for k in view.visible() if f"-b{batch}-" in k]
                == (files_of(record.txn_id) if committed else []))
        assert [k for k in view.staged() if f"-b{batch}-" in k] == []


def test_two_aborts_of_a_decided_first_batch_finish_it_once(
    store_factory: Callable[[], Storage], request: pytest.FixtureRequest
) -> None:
    """Issue #27.1 for the file sinks: the committer of batch 0 decided to promote and
    died before its claim, on a destination nothing was ever promoted to; two aborters
    (a recovery and the commit step) race. The claim is one conditional create, so both
    find the transaction committed and its files are promoted once."""
    for batch in range(request.node.rounds):
        one = CopySink(store_factory())
        record = one.stage_batch(batch, 1)
        plan, files = one._plan(record)
        claims.decide(one.store, claims.decision_key(JOB, record.txn_id),
                      claims._decision(record, claims.PROMOTE, plan, files))

        outcomes = _race(_abort(one, record), _abort(CopySink(store_factory()), record))

        assert outcomes == ["refused", "refused"], outcomes
        view = CopySink(store_factory())
        assert claims.is_committed(view.store, record)
        assert [k for k in view.visible() if f"-b{batch}-" in k] == files_of(record.txn_id)
        assert [k for k in view.staged() if f"-b{batch}-" in k] == []


def _process_racer(root: str, record: TransactionRecord, start_at: float, out: Any) -> None:
    sink = CopySink(LocalStorage(root))
    time.sleep(max(0.0, start_at - time.time()))
    try:
        out.put((record.generation, sink.commit(record).status))
    except TransactionConflict:
        out.put((record.generation, "lost"))


def test_separate_processes_on_a_local_directory_promote_each_batch_once(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    root = str(tmp_path / "dest")
    for batch in range(3):
        out = context.Queue()
        records = [CopySink(LocalStorage(root)).stage_batch(batch, g) for g in (1, 2, 3)]
        start_at = time.time() + 0.5
        procs = [context.Process(target=_process_racer, args=(root, r, start_at, out)) for r in records]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        outcomes = dict(out.get(timeout=10) for _ in procs)
        assert sorted(outcomes.values()) == ["committed", "lost", "lost"], outcomes
        winner = next(g for g, s in outcomes.items() if s == "committed")
        view = CopySink(LocalStorage(root))
        assert [k for k in view.visible() if f"-b{batch}-" in k] == files_of(f"{JOB}-b{batch}-g{winner}")
        assert [k for k in view.staged() if f"-b{batch}-" in k] == []
