"""What a restart needs from Spark's live checkpoint location, and path rewriting."""

from __future__ import annotations

import os

import pytest

from airflow_sparkpoint.runtime import livedir
from airflow_sparkpoint.runtime.restore import _path_forms, _rewrite_paths


@pytest.mark.parametrize(
    ("path", "batch", "needed"),
    [
        ("metadata", 3, True),
        ("offsets/3", 3, True),
        ("offsets/4", 3, False),  # planned, not committed: re-planned after restore
        ("commits/3", 3, True),
        ("commits/4", 3, False),
        ("sources/0/3", 3, True),
        ("sources/0/9.compact", 3, False),
        ("sources/0/9.compact", 9, True),
        ("state/0/1/4.changelog", 3, True),  # state after batch 3 is version 4
        ("state/0/1/5.changelog", 3, False),
        ("state/0/1/4.zip", 3, True),
        ("state/0/1/5_8c1f7d9e-7a2b-4a1e-9c1e-1a2b3c4d5e6f.zip", 3, False),
        ("state/0/1/4.delta", 3, True),
        ("state/0/1/4.snapshot", 3, True),
        ("state/0/1/SSTs/000008-abc.sst", 3, True),
        ("state/0/_metadata/schema", 3, True),
        ("state/0/_metadata/v2/3", 3, True),
        ("state/0/_metadata/v2/4", 3, False),
    ],
)
def test_needed_for_restart(path, batch, needed):
    assert livedir.needed_for_restart(path, batch) is needed


def test_walk_skips_checksums_and_temp_files(tmp_path):
    for name in ("commits/0", "commits/.0.crc", "offsets/0", "offsets/.0.tmp", "state/0/0/1.changelog"):
        target = tmp_path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("x")
    assert sorted(f.path for f in livedir.walk(str(tmp_path))) == ["commits/0", "offsets/0", "state/0/0/1.changelog"]
    assert livedir.last_commit(str(tmp_path)) == 0
    assert livedir.last_commit(str(tmp_path / "nowhere")) is None


def test_local_path_of():
    assert livedir.local_path_of("file:///a/b") == "/a/b"
    assert livedir.local_path_of("file:/a/b") == "/a/b"
    assert livedir.local_path_of("/a/b") == "/a/b"
    assert livedir.local_path_of("s3a://bucket/x") is None


def test_rewrite_paths_replaces_every_form_once(tmp_path):
    # g1 is a prefix of g10: a naive sequence of replaces would produce g100.
    target = tmp_path / "meta"
    target.write_bytes(b'{"a":"file:/work/live/g1/state/x","b":"file:///work/live/g1/y","c":"/work/live/g1/z"}')
    assert _rewrite_paths(str(target), _path_forms("/work/live/g1"), "/work/live/g10")
    assert target.read_bytes() == (
        b'{"a":"file:/work/live/g10/state/x","b":"file:///work/live/g10/y","c":"/work/live/g10/z"}'
    )
    other = tmp_path / "other"
    other.write_bytes(b"no paths here")
    assert not _rewrite_paths(str(other), _path_forms("/work/live/g1"), "/x")
    assert os.listdir(tmp_path) == sorted(os.listdir(tmp_path))  # no temp files left behind
    assert not [n for n in os.listdir(tmp_path) if "tmp" in n]
