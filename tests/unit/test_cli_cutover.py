"""`sparkpoint cutover list`: blue's final savepoint of N once green claimed (the table
and the JSON shape of docs/CLI.md), and where a rollback after the cutover returned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverClaim, CutoverStore
from airflow_sparkpoint.cli import main
from airflow_sparkpoint.storage import open_storage
from tests.support.cutover_records import CID, cutover_plan


def test_cutover_list_names_blue_s_final_savepoint_and_the_rollback_s_return(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    catalog = Catalog(open_storage(str(tmp_path)), "orders")
    store = CutoverStore(catalog)
    store.plan(cutover_plan(warmup_uri=f"{catalog.uri}/chk-3", warmup_batch=3,
                            green_root=str(tmp_path / "shadow")))
    store.agree(CID, 5, "1764370000001-0123abcd")
    savepoint = f"{catalog.uri}/savepoints/savepoint-6-1c2d3e4f"
    store.claim(CutoverClaim(CID, 2, 5, f"{catalog.uri}/chk-6", savepoint=savepoint))
    store.roll_back(CID, generation=2, reason="test", restore=savepoint)

    assert main(["cutover", "list", "--dir", str(tmp_path), "--job", "orders", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["cutovers"][0]
    assert (shown["step"], shown["blue_checkpoint"], shown["blue_savepoint"], shown["rolled_back_to"]) == (
        "rolled_back", f"{catalog.uri}/chk-6", savepoint, savepoint)
    assert main(["cutover", "list", "--dir", str(tmp_path), "--job", "orders"]) == 0
    out = capsys.readouterr().out
    assert "BLUE'S SAVEPOINT" in out and savepoint in out
