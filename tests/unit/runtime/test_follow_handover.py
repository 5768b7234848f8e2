"""`follow.prepare` builds the cutover's handover (`runtime.cutover.CutoverHandover`)
when a shadow run names its cutover (``spark.sparkpoint.cutover``), on a real local
store with blue's checkpoint and the cutover's plan."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_sparkpoint.checkpoints import Catalog
from airflow_sparkpoint.checkpoints.cutover import CutoverStore
from airflow_sparkpoint.exceptions import CutoverError
from airflow_sparkpoint.runtime import follow
from airflow_sparkpoint.runtime.config import PREFIX, SparkpointConfig
from airflow_sparkpoint.runtime.cutover import CutoverHandover
from airflow_sparkpoint.sinks.directory import DirectorySink
from tests.support.cutover_records import CID, cutover_plan
from tests.support.records import put_checkpoint


def blue(tmp_path: Path) -> Catalog:
    """Blue's job 'orders' (generation 1) with a followable checkpoint at batch 2."""
    catalog = Catalog.open(str(tmp_path / "blue"), "orders")
    put_checkpoint(catalog, {"offsets/2": b'v1\n{}\n{"logOffset":2}'}, batch_id=2, generation=1)
    return catalog


def config(tmp_path: Path, cutover: str | None) -> SparkpointConfig:
    conf = {f"{PREFIX}dir": str(tmp_path / "blue"), f"{PREFIX}job": "orders",
            f"{PREFIX}shadow.mode": "discard", f"{PREFIX}shadow.dir": str(tmp_path / "shadow")}
    if cutover is not None:
        conf[f"{PREFIX}cutover"] = cutover
    return SparkpointConfig.from_conf(conf)


def sink(tmp_path: Path) -> DirectorySink:
    return DirectorySink(str(tmp_path / "out"))


def plan(catalog: Catalog) -> None:
    latest = catalog.latest()
    assert latest is not None
    CutoverStore(catalog).plan(cutover_plan(warmup_uri=catalog.checkpoint_uri(latest.id),
                                            warmup_batch=latest.batch_id, green_root="/tmp/shadow"))


def test_a_shadow_naming_its_cutover_follows_that_cutover_s_records(tmp_path: Path) -> None:
    catalog = blue(tmp_path)
    plan(catalog)
    shadowing = follow.prepare(config(tmp_path, CID), sink(tmp_path))
    handover = shadowing.handover
    assert isinstance(handover, CutoverHandover)
    assert (handover.cutover_id, handover.catalog.job, handover.catalog.uri) == (CID, "orders", catalog.uri)
    assert handover.sink is shadowing.user_sink
    assert handover.agreed_batch() is None  # planned, not agreed: the shadow follows on
    assert follow.prepare(config(tmp_path, None), sink(tmp_path)).handover is None  # a plain warm-up


def test_an_explicit_handover_wins_over_the_cutover_setting(tmp_path: Path) -> None:
    blue(tmp_path)  # no cutover planned: the setting is not even read
    mine = object()
    shadowing = follow.prepare(config(tmp_path, CID), sink(tmp_path), mine)  # type: ignore[arg-type]
    assert shadowing.handover is mine


def test_a_cutover_that_is_missing_or_ended_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    catalog = blue(tmp_path)
    with pytest.raises(CutoverError, match=rf"cutover {CID} of job 'orders' has no plan"):
        follow.prepare(config(tmp_path, CID), sink(tmp_path))
    plan(catalog)
    CutoverStore(catalog).end(CID, "aborted", step="warmup", reason="called off")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CutoverError, match=rf"cutover {CID} of job 'orders' is done \(aborted at warmup"):
        follow.prepare(config(tmp_path, CID), sink(tmp_path))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    assert not (tmp_path / "shadow").exists()
