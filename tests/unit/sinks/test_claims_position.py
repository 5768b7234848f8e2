"""A file sink's committed position without listing every claim (issue 32: jobs that run for
weeks). A claim is kept for ever, one per batch (≈ 200,000 a week at a batch every 3 s),
and a run start asks for the position three or four times: each asked for a listing of
all of them. Every claim is now preceded by a marker under ``_sparkpoint/claimed/<job>/``
whose key sorts the newest batch first; the position is the newest marked batch whose claim
exists, then the batches claimed after it without a marker (a process of an earlier
release); a job with no marked claim is listed as before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_sparkpoint.checkpoints.metadata import TransactionRecord
from airflow_sparkpoint.sinks import _claims as claims
from airflow_sparkpoint.sinks import _manifests as manifests
from airflow_sparkpoint.sinks.directory import DirectorySink
from airflow_sparkpoint.storage.counting import CountingStorage
from tests.support.records import transaction_record
from tests.support.sink_files import staged_transaction

JOB = "orders"


@pytest.fixture()
def sink(tmp_path: Path) -> DirectorySink:
    return DirectorySink(str(tmp_path / "out"), "json")


def commit(sink: DirectorySink, batch: int, generation: int = 1) -> TransactionRecord:
    record = staged_transaction(sink, batch, generation, job=JOB)
    sink.commit(record)
    return record


def position(sink: DirectorySink) -> tuple[int | None, list[tuple[str, str]]]:
    """The committed position, and the requests reading it made."""
    counting = CountingStorage(sink._storage())
    found = manifests.committed_position(counting, JOB)
    return found, list(counting.log)


def old_release_claim(sink: DirectorySink, batch: int) -> None:
    """A claim as a process of the previous release writes it: no marker before it."""
    claim = {"job": JOB, "batch_id": batch, "generation": 1, "txn_id": f"{JOB}-b{batch}-g1", "files": []}
    sink._storage().put(manifests.manifest_key(JOB, batch), json.dumps(claim).encode())


def test_the_position_of_many_claims_is_read_without_listing_them(sink: DirectorySink) -> None:
    for batch in range(300):
        commit(sink, batch)
    found, requests = position(sink)
    assert found == 299
    assert not [key for op, key in requests if op == "list" and key.startswith(manifests.MANIFESTS)], requests
    assert len(requests) <= 4, requests
    markers = [info.key for info in sink._storage().list(manifests.MARKERS)]
    assert len(markers) <= 2 * manifests.MARKERS_KEPT, \
        f"{len(markers)} markers: old ones are deleted in steps"


def test_a_marker_whose_claim_was_never_written_is_passed_over(sink: DirectorySink) -> None:
    """A claimer that dies between its marker and its claim: the batch before is the position."""
    for batch in range(3):
        commit(sink, batch)
    store = sink._storage()
    store.put(manifests.marker_key(JOB, 3), b"")
    store.put(manifests.marker_key(JOB, 4), b"")
    assert position(sink)[0] == 2
    commit(sink, 3)  # the batch's re-run claims it
    assert position(sink)[0] == 3


def test_claims_an_earlier_release_wrote_are_still_counted(sink: DirectorySink) -> None:
    """Before any marker: every claim is listed (as before). After the marked ones, claims a
    process of the previous release took next (a commit step not upgraded yet) are found
    by a listing, until this release claims a batch after them."""
    for batch in range(5):
        old_release_claim(sink, batch)
    found, requests = position(sink)
    assert (found == 4
            and [key for op, key in requests if op == "list" and key.startswith(manifests.MANIFESTS)])
    commit(sink, 5)
    assert position(sink)[0] == 5
    old_release_claim(sink, 6)
    old_release_claim(sink, 7)
    found, requests = position(sink)
    assert found == 7, "claims without a marker after the newest marker: the claims are listed"
    commit(sink, 8)
    found, requests = position(sink)
    assert found == 8
    assert not [key for op, key in requests if op == "list" and key.startswith(manifests.MANIFESTS)], requests


def test_markers_that_name_no_claim_at_all_fall_back_to_the_listing(sink: DirectorySink) -> None:
    """Only markers whose claims are gone (deleted by hand, as the protocol allows for a
    stuck claim): the position comes from the claims, never from a marker alone."""
    for batch in range(3):
        commit(sink, batch)
    store = sink._storage()
    store.delete([manifests.manifest_key(JOB, 2), manifests.manifest_key(JOB, 1)])
    assert position(sink)[0] == 0
    store.delete([manifests.manifest_key(JOB, 0)])
    assert position(sink)[0] is None


def test_another_jobs_markers_and_objects_not_named_as_markers_are_passed_over(sink: DirectorySink) -> None:
    commit(sink, 0)
    store = sink._storage()
    store.put(manifests.marker_key(f"{JOB}-eu", 7), b"")
    store.put(manifests.manifest_key(f"{JOB}-eu", 7), b"{}")
    store.put(f"{manifests.MARKERS}/{JOB}/0000000000000000000-planted", b"")
    assert position(sink)[0] == 0


def test_the_marker_precedes_the_claim(sink: DirectorySink, monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim is the commit; its marker is written before it, so no claim of this release
    is ever without one (a failed marker write fails the commit before it claims)."""
    store = sink._storage()
    order: list[str] = []
    put, put_if_absent = type(store).put, type(store).put_if_absent

    def noting_put(self: Any, key: str, data: bytes) -> None:
        order.append(key)
        put(self, key, data)

    def noting_put_if_absent(self: Any, key: str, data: bytes) -> None:
        order.append(key)
        put_if_absent(self, key, data)

    monkeypatch.setattr(type(store), "put", noting_put)
    monkeypatch.setattr(type(store), "put_if_absent", noting_put_if_absent)
    commit(sink, 0)
    marker, claim = manifests.marker_key(JOB, 0), manifests.manifest_key(JOB, 0)
    assert marker in order and claim in order and order.index(marker) < order.index(claim), order
    assert claims.is_committed(store, transaction_record(sink, 0, 1, job=JOB))


def test_planted_markers_without_claims_cost_a_bounded_number_of_looks(sink: DirectorySink) -> None:
    """A writer of the output location plants markers of batches never claimed: the position
    still comes from the claims, after at most `MARKERS_KEPT` + 1 looks at markers."""
    for batch in range(3):
        commit(sink, batch)
    store = sink._storage()
    for batch in range(1_000, 1_500):
        store.put(manifests.marker_key(JOB, batch), b"")
    found, requests = position(sink)
    assert found == 2
    assert len([key for op, key in requests if op == "exists"]) <= manifests.MARKERS_KEPT + 2, requests


def test_many_claims_of_an_earlier_release_after_the_newest_marker_are_listed_once(
    sink: DirectorySink
) -> None:
    commit(sink, 0)
    for batch in range(1, manifests.MARKERS_KEPT + 20):
        old_release_claim(sink, batch)
    found, requests = position(sink)
    assert found == manifests.MARKERS_KEPT + 19
    assert len([key for op, key in requests if op == "exists"]) <= 2, requests


def test_claims_of_an_earlier_release_past_a_gap_are_found(sink: DirectorySink) -> None:
    """A process of the previous release claimed batches after the newest marker, and one of
    its claims was released by hand (a stuck claim, as the protocol allows): the claims past
    the gap count too. Once a claim without a marker is met, the claims are listed."""
    commit(sink, 0)
    for batch in (1, 2, 3):
        old_release_claim(sink, batch)
    sink._storage().delete([manifests.manifest_key(JOB, 2)])
    assert position(sink)[0] == 3
