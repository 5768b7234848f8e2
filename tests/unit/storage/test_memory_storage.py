"""MemoryStorage: stores of one name share their contents, and their lock with them."""

from __future__ import annotations

import threading
import uuid

from airflow_sparkpoint.exceptions import ObjectExists
from airflow_sparkpoint.storage import MemoryStorage


def test_two_stores_of_one_name_list_and_write_at_once_without_a_torn_iteration() -> None:
    """A listing through one instance while another instance of the same name writes:
    both hold the one lock of that name (found as a flaky `dictionary changed size
    during iteration` in tests/unit/sinks/test_claims.py: each instance had its own)."""
    name = f"shared-{uuid.uuid4().hex[:8]}"
    reader, writer = MemoryStorage(name), MemoryStorage(name)
    for index in range(20_000):
        writer.put(f"seed/{index}", b"x")
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        index = 0
        while not done.is_set():
            writer.put(f"more/{index}", b"y")
            writer.delete([f"more/{index - 50}"])
            index += 1

    thread = threading.Thread(target=write)
    thread.start()
    try:
        for _ in range(30):
            try:
                sum(1 for _ in reader.list("seed/"))
            except RuntimeError as exc:
                errors.append(exc)
                break
    finally:
        done.set()
        thread.join()
    assert errors == []


def test_put_if_absent_is_atomic_across_instances_of_one_name() -> None:
    name = f"claim-{uuid.uuid4().hex[:8]}"
    stores = [MemoryStorage(name) for _ in range(8)]
    won: list[int] = []
    barrier = threading.Barrier(len(stores))

    def claim(index: int) -> None:
        barrier.wait()
        for key in range(300):
            try:
                stores[index].put_if_absent(f"claims/{key}", str(index).encode())
            except ObjectExists:
                continue
            won.append(key)

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(won) == list(range(300)), "each key is claimed exactly once"
