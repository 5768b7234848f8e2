"""`storage.localfs`: every path below a root reached from a descriptor, no link followed,
no FIFO read, reads bounded, deletes that never descend a link (issue #46)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_sparkpoint.exceptions import InvalidPath, ObjectTooLarge
from airflow_sparkpoint.storage.localfs import Dir, open_path, remove_tree_at


@pytest.fixture()
def outside(tmp_path: Path) -> Path:
    victim = tmp_path / "outside"
    (victim / "sub").mkdir(parents=True)
    (victim / "precious.txt").write_text("must survive")
    (victim / "sub" / "deep.txt").write_text("must survive")
    return victim


def survived(victim: Path) -> bool:
    return (victim / "precious.txt").read_text() == "must survive" and \
        (victim / "sub" / "deep.txt").read_text() == "must survive"


@pytest.fixture()
def root(tmp_path: Path) -> Iterator[Dir]:
    (tmp_path / "root").mkdir()
    with Dir.open(str(tmp_path / "root")) as opened:
        yield opened


def test_a_link_on_the_way_is_refused_naming_it(tmp_path: Path, root: Dir, outside: Path) -> None:
    (tmp_path / "root" / "a").mkdir()
    (tmp_path / "root" / "a" / "link").symlink_to(outside, target_is_directory=True)
    for action in (lambda: root.read("a/link/precious.txt", 100), lambda: root.sub("a/link"),
                   lambda: root.write("a/link/new.txt", b"x"), lambda: root.stat("a/link/precious.txt"),
                   lambda: root.names("a/link"), lambda: root.makedirs("a/link/more")):
        with pytest.raises(InvalidPath, match=r"root/a/link is a symbolic link"):
            action()
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt", "sub"] and survived(outside)


def test_a_link_as_the_file_itself_is_not_read_and_is_replaced_not_written_through(
        tmp_path: Path, root: Dir, outside: Path) -> None:
    (tmp_path / "root" / "f").symlink_to(outside / "precious.txt")
    with pytest.raises(InvalidPath, match="root/f is a symbolic link"):
        root.read("f", 100)
    assert not root.is_file("f")
    root.write("f", b"new")
    assert not (tmp_path / "root" / "f").is_symlink() and (tmp_path / "root" / "f").read_bytes() == b"new"
    assert survived(outside)


def test_a_fifo_is_refused_at_once(tmp_path: Path, root: Dir) -> None:
    os.mkfifo(tmp_path / "root" / "pipe")
    result: list[BaseException] = []

    def read() -> None:
        try:
            root.read("pipe", 100)
        except BaseException as exc:  # noqa: BLE001 - inspected below
            result.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():
        os.close(os.open(tmp_path / "root" / "pipe", os.O_WRONLY | os.O_NONBLOCK))
    assert not reader.is_alive(), "reading a FIFO blocked"
    assert isinstance(result[0], InvalidPath) and "root/pipe is not a regular file" in str(result[0])
    with pytest.raises(InvalidPath, match="not a regular file"):
        open_path(str(tmp_path / "root" / "pipe"))


def test_reads_are_bounded_and_name_the_file(tmp_path: Path, root: Dir) -> None:
    with open(tmp_path / "root" / "sparse", "wb") as handle:
        handle.truncate(1 << 30)
    with pytest.raises(ObjectTooLarge, match=r"root/sparse is 1073741824 bytes, over the limit of 1024"):
        root.read("sparse", 1024)
    (tmp_path / "root" / "lines").write_bytes(b"v1\nshort\n" + b"x" * 5000 + b"\nend")
    lines = root.lines("lines", 4096)
    assert [next(lines), next(lines)] == [b"v1", b"short"]
    with pytest.raises(ObjectTooLarge, match="root/lines has a line longer than 4096 bytes"):
        next(lines)
    with pytest.raises(ObjectTooLarge):
        next(root.lines("sparse", 1 << 20))  # one line of a GiB of NULs: refused after 1 MiB


def test_remove_tree_unlinks_links_and_never_descends_them(tmp_path: Path, root: Dir, outside: Path) -> None:
    tree = tmp_path / "root" / "t"
    (tree / "a" / "b").mkdir(parents=True)
    (tree / "a" / "b" / "f").write_text("x")
    (tree / "a" / "to-dir").symlink_to(outside, target_is_directory=True)
    (tree / "to-file").symlink_to(outside / "precious.txt")
    (tmp_path / "root" / "l").symlink_to(outside, target_is_directory=True)
    assert root.remove_tree("t") and not tree.exists()
    assert root.remove_tree("l") and not (tmp_path / "root" / "l").is_symlink()
    assert not root.remove_tree("t")
    (tmp_path / "root" / "l").symlink_to(outside, target_is_directory=True)
    with pytest.raises(InvalidPath, match="root/l is a symbolic link"):
        root.remove_tree("l/sub")
    assert survived(outside)


def test_remove_tree_deletes_a_tree_deeper_than_the_python_stack(tmp_path: Path, root: Dir) -> None:
    depth = 1500  # sys.getrecursionlimit() is 1000
    fd = os.open(tmp_path / "root", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)
    assert root.remove_tree("d") and os.listdir(tmp_path / "root") == []


def test_rename_and_link_between_two_roots_follow_no_link(tmp_path: Path, root: Dir, outside: Path) -> None:
    (tmp_path / "other").mkdir()
    (tmp_path / "root" / "src").mkdir()
    (tmp_path / "root" / "src" / "f").write_text("data")
    (tmp_path / "other" / "dst").symlink_to(outside, target_is_directory=True)
    with Dir.open(str(tmp_path / "other")) as other:
        with pytest.raises(InvalidPath, match="other/dst is a symbolic link"):
            root.rename("src/f", other, "dst/f")
        root.rename("src/f", other, "real/f")
        assert (tmp_path / "other" / "real" / "f").read_text() == "data"
        (tmp_path / "root" / "src" / "l").symlink_to(outside / "precious.txt")
        assert root.link_to("src/l", other, "linked") is None, "a link was hard-linked in"
        assert other.link_to("real/f", root, "copy/f") is not None
    assert (tmp_path / "root" / "copy" / "f").stat().st_nlink == 2
    assert sorted(p.name for p in outside.iterdir()) == ["precious.txt", "sub"] and survived(outside)


def test_create_is_exclusive_and_write_if_changed_keeps_an_equal_file(tmp_path: Path, root: Dir) -> None:
    root.create("a/b", b"one")
    with pytest.raises(FileExistsError):
        root.create("a/b", b"two")
    before = (tmp_path / "root" / "a" / "b").stat().st_ino
    assert not root.write("a/b", [b"o", b"ne"], if_changed=True)
    assert (tmp_path / "root" / "a" / "b").stat().st_ino == before
    assert root.write("a/b", [b"t", b"wo"], if_changed=True)
    assert (tmp_path / "root" / "a" / "b").read_bytes() == b"two"
    assert [p.name for p in (tmp_path / "root" / "a").iterdir()] == ["b"], "a temp file was left"


def test_walk_files_lists_regular_files_only(tmp_path: Path, root: Dir, outside: Path) -> None:
    base = tmp_path / "root"
    (base / "d" / ".hidden").mkdir(parents=True)
    (base / "d" / "f").write_text("x")
    (base / "d" / ".hidden" / "g").write_text("x")
    (base / "d" / "link-dir").symlink_to(outside, target_is_directory=True)
    (base / "d" / "link-file").symlink_to(outside / "precious.txt")
    os.mkfifo(base / "d" / "pipe")
    found = sorted(path for path, _st in root.walk_files("d", skip=lambda name, _dir: name.startswith(".")))
    assert found == ["f"]


def test_an_anchored_open_follows_links_only_up_to_the_anchor(tmp_path: Path, outside: Path) -> None:
    (tmp_path / "configured").symlink_to(outside, target_is_directory=True)  # the operator's own link
    with Dir.open(str(tmp_path / "configured")) as configured:
        assert configured.is_file("precious.txt")
    with pytest.raises(InvalidPath, match="configured is a symbolic link"):
        Dir.open(str(tmp_path / "configured"), anchor=str(tmp_path))
    assert remove_tree_at(str(tmp_path / "configured")) and survived(outside)
