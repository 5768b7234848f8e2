"""Key and name formats of `checkpoints.layout`."""

from __future__ import annotations

from airflow_sparkpoint.checkpoints import layout


def test_transaction_ids_parse_even_when_the_job_name_looks_like_one() -> None:
    assert layout.parse_txn_id("orders-b12-g3") == ("orders", 12, 3)
    assert layout.parse_txn_id("orders-b7-g1-b12-g3") == ("orders-b7-g1", 12, 3)
    assert layout.parse_txn_id("orders") is None


def test_a_built_transaction_id_parses_back() -> None:
    assert layout.txn_id("orders-b7-g1", 12, 3) == "orders-b7-g1-b12-g3"
    assert layout.parse_txn_id(layout.txn_id("a.b-c", 0, 41)) == ("a.b-c", 0, 41)
