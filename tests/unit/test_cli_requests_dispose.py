"""`sparkpoint requests list|withdraw` (the id `savepoint --no-wait` prints is accepted)
and `sparkpoint dispose --older-than/--keep` (savepoint retention from the command
line: never the newest savepoint, nor the one the newest lineage started from). JSON
shapes: docs/CLI.md."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from airflow_sparkpoint.checkpoints import retention
from airflow_sparkpoint.checkpoints.catalog import Catalog
from airflow_sparkpoint.checkpoints.control import ControlChannel
from airflow_sparkpoint.checkpoints.lineage import new_origin
from tests.support.cli_runs import job_with_checkpoints, run
from tests.support.records import write_status

REQUEST_KEYS = {"id", "kind", "state", "generation", "created_at", "created", "deadline", "requested_by"}
WITHDRAW_KEYS = {"job", "root", "request_id", "withdrawn", "state", "generation", "error"}
RETENTION_KEYS = {"job", "root", "keep", "older_than_s", "disposed_savepoints", "kept_savepoints"}


@pytest.fixture()
def root(tmp_path: Path) -> Path:
    path = tmp_path / "root"
    path.mkdir()
    return path


def cli(capsys: pytest.CaptureFixture[str], root: Path, *argv: str) -> tuple[int, str, str]:
    command, rest = (argv[:2], argv[2:]) if argv[0] == "requests" else (argv[:1], argv[1:])
    return run(capsys, *command, "--dir", str(root), "--job", "orders", *rest)


def test_the_no_wait_id_is_listed_and_withdrawn(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    write_status(catalog)  # a live job that has not answered yet
    code, out, err = cli(capsys, root, "savepoint", "--no-wait")
    assert code == 0, err
    request_id = out.strip()

    code, out, err = cli(capsys, root, "requests", "list", "--json")
    assert code == 0, err
    listed = json.loads(out)["requests"]
    assert [r["id"] for r in listed] == [request_id] and set(listed[0]) == REQUEST_KEYS
    assert (listed[0]["kind"], listed[0]["state"], listed[0]["generation"]) == ("savepoint", "pending", 1)
    code, out, _ = cli(capsys, root, "requests", "list")
    assert code == 0 and request_id in out and "pending" in out

    code, out, err = cli(capsys, root, "requests", "withdraw", request_id, "--json", "--reason",
                         "deploy cancelled")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == WITHDRAW_KEYS and doc["withdrawn"] is True and doc["state"] == "expired"
    assert doc["error"] == "deploy cancelled"
    assert ControlChannel(catalog).pending() == []  # no job takes it later
    code, out, _ = cli(capsys, root, "requests", "list")
    assert code == 0 and "no open control requests" in out

    code, _, err = cli(capsys, root, "requests", "withdraw", request_id)  # once only
    assert code == 1 and "was not withdrawn: it already ended (expired: deploy cancelled)" in err


def test_an_acknowledged_request_is_not_withdrawn(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    channel = ControlChannel(catalog)
    request = channel.submit("stop", generation=1, timeout_s=60)
    channel.acknowledge(request, 1)
    code, _, err = cli(capsys, root, "requests", "withdraw", request.id)
    assert code == 1 and "generation 1 already took it" in err
    assert channel.result(request.id).state == "acknowledged"


def test_withdraw_bad_ids(capsys: pytest.CaptureFixture[str], root: Path) -> None:
    job_with_checkpoints(root, 1)
    code, _, err = cli(capsys, root, "requests", "withdraw", "not-an-id")
    assert code == 2 and "request id 'not-an-id' is malformed" in err
    code, _, err = cli(capsys, root, "requests", "withdraw", "1700000000000-0badc0de")
    assert code == 1 and "1700000000000-0badc0de" in err


def _savepoints(catalog: Catalog, count: int) -> list[str]:
    uris = []
    for _ in range(count):
        uris.append(catalog.create_savepoint(catalog.handle(catalog.latest())).uri)  # type: ignore[arg-type]
        time.sleep(0.01)  # distinct created_at
    return uris


def test_dispose_keep_never_the_newest_nor_the_lineages_origin(capsys: pytest.CaptureFixture[str],
                                                               root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    oldest, second, third, newest = _savepoints(catalog, 4)
    # The newest lineage started from the oldest savepoint (a rollback): restore=latest relies on it.
    catalog.claim_generation()
    catalog.write_origin(new_origin(2, kind="savepoint", uri=oldest, base_id=-1, snapshot_id=1, batch_id=0,
                                    id_floor=1, restore={}, live_dir=None, host="h", pid=1))
    code, out, err = cli(capsys, root, "dispose", "--keep", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert set(doc) == RETENTION_KEYS and doc["keep"] == 1 and doc["older_than_s"] is None
    assert sorted(doc["disposed_savepoints"]) == sorted([second, third])
    assert sorted(doc["kept_savepoints"]) == sorted([oldest, newest])
    assert sorted(e.uri for e in catalog.list_savepoints()) == sorted([oldest, newest])


def test_dispose_keep_says_why_each_savepoint_beyond_the_limit_is_kept(capsys: pytest.CaptureFixture[str],
                                                                       root: Path) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    oldest, second, newest = _savepoints(catalog, 3)
    catalog.claim_generation()
    catalog.write_origin(new_origin(2, kind="savepoint", uri=oldest, base_id=-1, snapshot_id=1, batch_id=0,
                                    id_floor=1, restore={}, live_dir=None, host="h", pid=1))
    code, out, err = cli(capsys, root, "dispose", "--keep", "1")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"disposed {second}"
    assert lines[1] == "1 savepoint(s) disposed, 2 kept:", out
    assert f"kept {newest} (the newest)" in lines, out
    assert (f"kept {oldest} (the job's newest lineage starts from it: restore=latest may restart there)"
            in lines), out


def test_dispose_older_than(capsys: pytest.CaptureFixture[str], root: Path,
                            monkeypatch: pytest.MonkeyPatch) -> None:
    catalog, _ = job_with_checkpoints(root, 1)
    *old, newest = _savepoints(catalog, 3)
    later = time.time() + 7200
    monkeypatch.setattr(retention, "time", SimpleNamespace(time=lambda: later))  # two hours on: all are old
    code, out, err = cli(capsys, root, "dispose", "--older-than", "1h")
    assert code == 0, err
    assert all(f"disposed {uri}" in out for uri in old) and "2 savepoint(s) disposed, 1 kept" in out
    assert [e.uri for e in catalog.list_savepoints()] == [newest], "the newest savepoint is always kept"


@pytest.mark.parametrize("argv",
                         [["dispose"], ["dispose", "savepoints/x", "--keep", "2"], ["dispose", "--keep", "0"],
                          ["dispose", "--older-than", "soon"]])
def test_dispose_usage(capsys: pytest.CaptureFixture[str], root: Path, argv: list[str]) -> None:
    job_with_checkpoints(root, 1)
    code, _, _ = cli(capsys, root, *argv)
    assert code == 2
