"""The fence (invariant 5: only the current generation acts): `Fence`, beside the
generation store, is the one check. It is made from a catalog or its generation store and
the generation a caller acts as; every call site in the catalog and the sinks goes through
it (the runtime's follow)."""

from __future__ import annotations

import ast
import uuid
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.generations import Fence
from airflow_sparkpoint.exceptions import StaleGeneration
from airflow_sparkpoint.storage import MemoryStorage
from airflow_sparkpoint.storage.counting import CountingStorage
from tests.support.records import transaction_record

PACKAGE = Path(__file__).resolve().parents[3] / "airflow_sparkpoint"


def test_a_fence_passes_while_its_generation_is_current_and_raises_once_a_newer_one_is_claimed(
    catalog: Catalog,
) -> None:
    old = catalog.claim_generation().generation
    for fence in (Fence(catalog, old), Fence(catalog.generation_store, old)):
        fence.check()
    newer = Catalog(catalog.storage, "orders").claim_generation().generation  # another process's claim
    for fence in (Fence(catalog, old), Fence(catalog.generation_store, old)):
        with pytest.raises(StaleGeneration,
                           match=f"generation {old} of job 'orders' was superseded by generation {newer}"):
            fence.check()
    Fence(catalog, newer).check()
    Fence(catalog, None).check()  # unfenced: never raises


def test_an_observed_fence_acts_as_the_newest_claim_and_admits_no_newer_record(catalog: Catalog) -> None:
    assert Fence.observed(catalog).generation == 0
    catalog.claim_generation()
    second = catalog.claim_generation().generation
    fence = Fence.observed(Catalog(catalog.storage, "orders"))
    assert fence.generation == second
    older, same, newer = (transaction_record("DeltaSink", 1, g, job="orders", sink_id="s")
                          for g in (second - 1, second, second + 1))
    assert fence.admits(same) and fence.admits(older)
    assert not fence.admits(newer)
    assert Fence(catalog, None).admits(transaction_record("DeltaSink", 1, 99, job="orders", sink_id="s"))


def test_a_fence_checks_with_one_existence_check_and_no_listing() -> None:
    counting = CountingStorage(MemoryStorage(f"fence-{uuid.uuid4().hex}"))
    catalog = Catalog(counting, "orders")
    generation = catalog.claim_generation().generation
    counting.reset()
    Fence(catalog, generation).check()
    assert [op for op, _key in counting.log] == ["stat"]  # an existence check: one HEAD


def _calls(path: Path, name: str) -> list[int]:
    tree = ast.parse(path.read_text(), str(path))
    return [node.lineno for node in ast.walk(tree) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == name]


def test_the_package_and_the_test_support_check_the_fence_only_through_fence() -> None:
    """No second idiom (a raw ``catalog.check_generation``) anywhere in the package (the
    catalog's method stays for callers outside it) nor in tests/support/, whose fakes act
    as the package's actors do."""
    found = {str(path.relative_to(PACKAGE.parent)): lines
             for path in sorted([*PACKAGE.rglob("*.py"),
                                 *(PACKAGE.parent / "tests" / "support").rglob("*.py")])
             if (lines := _calls(path, "check_generation"))}
    assert found == {}, f"raw check_generation calls (use Fence): {found}"
