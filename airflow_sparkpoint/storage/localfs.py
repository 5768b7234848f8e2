"""Every local filesystem operation on a place Sparkpoint shares with others (issue #46).

Whoever can write a sink's output location, the work directory (live locations) or a
local store can replace any entry there with a symbolic link to anywhere, a FIFO or a
sparse file of any size. So below a root no path is resolved by the kernel: a `Dir` is an
open directory descriptor, every path below it is reached one component at a time with
``O_NOFOLLOW`` (a link on the way is refused, never followed); files are opened with
``O_NOFOLLOW | O_NONBLOCK`` and checked on the descriptor to be regular before a read
(a FIFO cannot block, nothing changes between check and read); reads are bounded;
deletes work from descriptors (a link inside a tree is unlinked, never descended);
renames and hard links take both ends as descriptors of Sparkpoint's own directories;
writes are a temp file renamed over the name.

A configured root (a store, a sink location, ``workDir``) is the operator's choice and
opened as given, links in its path included (a mount point); a root derived from another
(``<dir>/<job>/live``, a ``g<N>``) is opened below its anchor (`Dir.open`'s `anchor`).
Nothing outside this module and its descriptor routines (`_localfs_fd`) calls
``shutil.rmtree``, ``os.replace``, ``os.listdir`` and their kind: ``make lint`` checks it
(``scripts/check_local_fs.py``).

Errors: a missing entry is the system's `OSError` (`FileNotFoundError`,
`NotADirectoryError`); a link, a non-regular file or a path that climbs out is
`InvalidPath` naming the path; a read over its limit is `ObjectTooLarge` naming it.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from types import TracebackType
from typing import BinaryIO, TypeAlias

from airflow_sparkpoint.exceptions import InvalidPath
from airflow_sparkpoint.storage import _localfs_fd as _fdops

__all__ = ["TMP_MARK", "Dir", "open_path", "parts", "remove_tree_at"]

#: the mark of a temp file this module writes (readers of a directory skip such names)
TMP_MARK = ".sparkpoint-tmp-"

#: what `Dir.write` writes: bytes, the chunks an iterable yields, or an open file's rest
Data: TypeAlias = "bytes | bytearray | memoryview | BinaryIO | Iterable[bytes]"


def parts(rel: str) -> list[str]:
    """The components of `rel`, a relative ``/``-separated path (``""`` and ``.`` are the
    directory itself; empty and ``.`` segments are dropped).

    :raises InvalidPath: `rel` is absolute, has a ``..`` segment or a NUL.
    """
    if rel.startswith("/") or "\x00" in rel:
        raise InvalidPath(f"path {rel!r} is absolute or has a NUL; expected a relative path")
    found = [part for part in rel.split("/") if part not in ("", ".")]
    if ".." in found:
        raise InvalidPath(f"path {rel!r} climbs out with '..'; expected a path inside its directory")
    return found


class Dir:
    """An open directory of Sparkpoint's; every path below it is reached from its
    descriptor without following a link. Close it (or use it as a context manager)."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        #: the directory's path, for messages only (never used to reach a file)
        self.path = path

    # -- opening ------------------------------------------------------------------

    @classmethod
    def open(cls, path: str, *, create: bool = False, anchor: str | None = None) -> Dir:
        """The directory at `path` (absolute). The path up to `anchor` (default: `path`
        itself: a configured root) is resolved by the system; every component after it
        is opened without following a link.

        :raises FileNotFoundError: it does not exist (and not `create`).
        :raises InvalidPath: a component after `anchor` is a symbolic link.
        """
        path = os.path.abspath(path)
        base = os.path.abspath(anchor) if anchor is not None else path
        rel = os.path.relpath(path, base)
        if rel == ".." or rel.startswith("../"):
            raise InvalidPath(f"{path} is not below {base}")
        try:
            top = cls(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), base)
        except FileNotFoundError:
            if not create:
                raise
            os.makedirs(base, exist_ok=True)
            top = cls(os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), base)
        if rel == ".":
            return top
        try:
            return top.sub(rel.replace(os.sep, "/"), create=create)
        finally:
            top.close()

    def sub(self, rel: str, *, create: bool = False) -> Dir:
        """The directory `rel` below this one (created with its parents when `create`).

        :raises FileNotFoundError: or `NotADirectoryError`: it is missing or a file.
        :raises InvalidPath: a component is a symbolic link.
        """
        names = parts(rel)
        fd = self._walk(names, create)
        return Dir(os.dup(fd) if fd == self.fd else fd, self._join(names))

    def close(self) -> None:
        if self.fd >= 0:
            _fdops.close_quietly(self.fd)
            self.fd = -1

    def __enter__(self) -> Dir:  # noqa: PYI034 - not subclassed
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Dir({self.path!r})"

    def _join(self, names: list[str]) -> str:
        return "/".join([self.path.rstrip("/") or "", *names]) if names else self.path

    def _refused(self, exc: OSError, names: list[str], dir_fd: int | None = None) -> BaseException:
        """`exc` from opening `names` (the last one in `dir_fd`) without following: a link
        is `InvalidPath` (``O_NOFOLLOW`` reports one as ``ELOOP``, or as ``ENOTDIR`` with
        ``O_DIRECTORY``)."""
        if exc.errno == errno.ENOTDIR and dir_fd is not None:
            try:
                link = stat.S_ISLNK(os.stat(names[-1], dir_fd=dir_fd, follow_symlinks=False).st_mode)
            except OSError:
                link = False
            if not link:
                return exc
        elif exc.errno != errno.ELOOP:
            return exc
        return InvalidPath(f"{self._join(names)} is a symbolic link; Sparkpoint "
                           f"follows no link in {self.path}")

    def _walk(self, names: list[str], create: bool) -> int:
        """A descriptor of the directory `names` below this one: this one's own for no
        names, else a new one; the caller hands it back to `_release`."""
        fd = self.fd
        for index, name in enumerate(names):
            try:
                try:
                    child = os.open(name, _fdops.DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    try:
                        os.mkdir(name, 0o777, dir_fd=fd)
                    except FileExistsError:
                        pass  # made meanwhile (or a link planted meanwhile: the open refuses it)
                    child = os.open(name, _fdops.DIR, dir_fd=fd)
            except OSError as exc:
                error = self._refused(exc, names[:index + 1], fd)
                self._release(fd)
                raise error from None
            self._release(fd)
            fd = child
        return fd

    def _release(self, fd: int) -> None:
        """Close `fd` from `_walk` or `_parent` unless it is this directory's own."""
        if fd != self.fd:
            _fdops.close_quietly(fd)

    def _parent(self, rel: str, create: bool = False) -> tuple[int, str, list[str]]:
        """(a descriptor of the parent of `rel` for `_release`, its last component, all
        components).

        :raises InvalidPath: `rel` names this directory itself, or climbs out.
        """
        names = parts(rel)
        if not names:
            raise InvalidPath(f"{rel!r} names the directory {self.path} itself; expected a path below it")
        return self._walk(names[:-1], create), names[-1], names

    # -- reading ------------------------------------------------------------------

    def _open_regular(self, dir_fd: int, name: str, names: list[str]) -> tuple[int, os.stat_result]:
        try:
            fd = os.open(name, _fdops.READ, dir_fd=dir_fd)
        except OSError as exc:
            raise self._refused(exc, names) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _fdops.close_quietly(fd)
            if stat.S_ISDIR(st.st_mode):
                raise IsADirectoryError(errno.EISDIR, "is a directory", self._join(names))
            raise InvalidPath(f"{self._join(names)} is not a regular file (a FIFO, socket or device); "
                              "Sparkpoint reads regular files only")
        return fd, st

    def open_file(self, rel: str) -> tuple[BinaryIO, os.stat_result]:
        """The regular file `rel` open for reading, and its status (of the open file).

        :raises FileNotFoundError: it is missing.
        :raises InvalidPath: it or a directory on its way is a link, or it is not a
            regular file.
        """
        dir_fd, name, names = self._parent(rel)
        try:
            fd, st = self._open_regular(dir_fd, name, names)
        finally:
            self._release(dir_fd)
        return os.fdopen(fd, "rb"), st  # O_NONBLOCK does nothing to a regular file's reads

    def read(self, rel: str, max_bytes: int) -> bytes:
        """The bytes of the regular file `rel`, read in chunks.

        :raises ObjectTooLarge: it holds more than `max_bytes` (treated as corrupt).
        :raises FileNotFoundError: it is missing.
        :raises InvalidPath: see `open_file`.
        """
        handle, st = self.open_file(rel)
        with handle:
            return _fdops.read_bounded(handle, st.st_size, max_bytes, self._join(parts(rel)))

    def read_text(self, rel: str, max_bytes: int) -> str | None:
        """`read` decoded as UTF-8, or None when `rel` (or a directory on its way) is missing."""
        try:
            return self.read(rel, max_bytes).decode("utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return None

    def lines(self, rel: str, max_line: int) -> Iterator[bytes]:
        """The lines of the regular file `rel` without their line breaks, read in chunks
        (memory bounded by `max_line`, whatever the file's size).

        :raises ObjectTooLarge: a line is longer than `max_line` (treated as corrupt).
        :raises FileNotFoundError: it is missing.
        :raises InvalidPath: see `open_file`.
        """
        handle, _st = self.open_file(rel)
        with handle:
            yield from _fdops.bounded_lines(handle, max_line, self._join(parts(rel)))

    def stat(self, rel: str) -> os.stat_result | None:
        """The status of `rel` itself (a link is reported as a link), or None when it or
        a directory on its way is missing.

        :raises InvalidPath: a directory on its way is a link.
        """
        try:
            dir_fd, name, _names = self._parent(rel)
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except (FileNotFoundError, NotADirectoryError):
            return None
        finally:
            self._release(dir_fd)

    def _type(self, rel: str) -> int:
        """The file type of `rel` (``stat.S_IFMT``), 0 when missing or behind a link."""
        try:
            st = self.stat(rel)
        except InvalidPath:
            return 0
        return 0 if st is None else stat.S_IFMT(st.st_mode)

    def is_file(self, rel: str) -> bool:
        """Whether `rel` is a regular file reached without a link."""
        return self._type(rel) == stat.S_IFREG

    def is_dir(self, rel: str) -> bool:
        """Whether `rel` is a directory reached without a link."""
        return self._type(rel) == stat.S_IFDIR

    def file_problem(self, rel: str) -> str | None:
        """None when `rel` is a regular file reached without a link; otherwise why it is
        not one (missing, a link on the way, not a regular file), for a message."""
        try:
            st = self.stat(rel)
        except InvalidPath as exc:
            return str(exc)
        if st is None:
            return "missing"
        return None if stat.S_ISREG(st.st_mode) else f"{self._join(parts(rel))} is not a regular file"

    def entries(self) -> list[os.DirEntry[str]]:
        """The entries of this directory (unsorted). An entry's
        ``is_dir(follow_symlinks=False)``, ``is_file(...)`` and ``stat(...)`` work from this
        directory's descriptor: use them while it is open."""
        with os.scandir(self.fd) as found:
            return list(found)

    def names(self, rel: str = "") -> list[str]:
        """The names in the directory `rel`, sorted (``[]`` when it is missing).

        :raises InvalidPath: `rel` or a directory on its way is a link.
        """
        try:
            fd = self._walk(parts(rel), False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        try:
            return sorted(os.listdir(fd))
        finally:
            self._release(fd)

    def subdirs(self, rel: str = "") -> list[str]:
        """The names of the directories (not links) in the directory `rel`, sorted (``[]``
        when it is missing).

        :raises InvalidPath: `rel` or a directory on its way is a link.
        """
        try:
            with self.sub(rel) as directory:
                return sorted(e.name for e in directory.entries() if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk_files(self, rel: str = "", *, skip: Callable[[str, bool], bool] | None = None
                   ) -> Iterator[tuple[str, os.stat_result]]:
        """Every regular file below the directory `rel`, as (path relative to `rel`,
        status), in no particular order; links, FIFOs and the entries `skip` accepts
        (called with the name and whether it is a directory) are left out, a link to a
        directory is never descended. Nothing when `rel` is missing.

        :raises InvalidPath: `rel` or a directory on its way is a link.
        """
        try:
            top = self._walk(parts(rel), False)
            top = os.dup(top) if top == self.fd else top  # walk_tree closes it
        except (FileNotFoundError, NotADirectoryError):
            return
        yield from _fdops.walk_tree(top, skip)

    # -- writing ------------------------------------------------------------------

    def open_fd(self, rel: str, flags: int, mode: int = 0o644) -> int:
        """A raw descriptor of the file `rel` opened with `flags` (``O_NOFOLLOW`` added:
        a link there is refused), for what needs one (a lock file). The caller closes it.

        :raises InvalidPath: it or a directory on its way is a link.
        """
        dir_fd, name, names = self._parent(rel, bool(flags & os.O_CREAT))
        try:
            return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
        except OSError as exc:
            raise self._refused(exc, names) from None
        finally:
            self._release(dir_fd)

    def _write_tmp(self, dir_fd: int, data: Data, fsync: bool) -> str:
        tmp = f"{TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, _fdops.CREATE, 0o644, dir_fd=dir_fd)
        try:
            if isinstance(data, bytes | bytearray | memoryview):
                _fdops.write_all(fd, data)
            elif hasattr(data, "fileno"):
                _fdops.copy(data.fileno(), fd)
            else:
                for chunk in data:
                    _fdops.write_all(fd, chunk)
            if fsync:
                os.fsync(fd)
        except BaseException:
            _fdops.close_quietly(fd)
            _fdops.unlink_quietly(tmp, dir_fd)
            raise
        os.close(fd)
        return tmp

    def write(self, rel: str, data: Data, *, fsync: bool = True, sync_dir: bool | None = None,
              create_dirs: bool = True, if_changed: bool = False) -> bool:
        """Write `rel` atomically (a temp file beside it, renamed over it): `data`, the
        chunks it yields, or everything an open file (`BinaryIO`) holds from its position
        on. A link at `rel` is replaced, never followed. With `fsync` the file is synced
        before the rename, with `sync_dir` (default: `fsync`) its directory after it. With
        `if_changed`, a regular file `rel` that already holds these bytes is left as it is
        (compared in chunks). Returns whether `rel` was written.

        :raises InvalidPath: a directory on its way is a link.
        :raises OSError: the write failed (nothing is left behind but the old file).
        """
        dir_fd, name, names = self._parent(rel, create_dirs)
        try:
            tmp = self._write_tmp(dir_fd, data, fsync)
            if if_changed and _fdops.same_file(dir_fd, tmp, name):
                _fdops.unlink_quietly(tmp, dir_fd)
                return False
            try:
                os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except BaseException:
                _fdops.unlink_quietly(tmp, dir_fd)
                raise
            if fsync if sync_dir is None else sync_dir:
                os.fsync(dir_fd)
            return True
        except OSError as exc:
            raise self._refused(exc, names) from None
        finally:
            self._release(dir_fd)

    def create(self, rel: str, data: bytes) -> None:
        """Create `rel` with `data` unless a name `rel` exists (a hard link of a synced
        temp file: atomic across processes on POSIX filesystems).

        :raises FileExistsError: `rel` exists (a link or a file of any kind).
        :raises InvalidPath: a directory on its way is a link.
        """
        dir_fd, name, names = self._parent(rel, True)
        try:
            tmp = self._write_tmp(dir_fd, data, True)
            try:
                os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
            finally:
                _fdops.unlink_quietly(tmp, dir_fd)
            os.fsync(dir_fd)
        except FileExistsError:
            raise
        except OSError as exc:
            raise self._refused(exc, names) from None
        finally:
            self._release(dir_fd)

    def makedirs(self, rel: str) -> None:
        """Create the directory `rel` with its parents (existing ones are fine).

        :raises InvalidPath: a component is a link.
        :raises NotADirectoryError: a component is a file.
        """
        self._release(self._walk(parts(rel), True))

    def fsync(self, rel: str = "") -> None:
        """Sync the directory `rel` (a rename or unlink in it is durable); missing is fine."""
        try:
            fd = self._walk(parts(rel), False)
        except (FileNotFoundError, NotADirectoryError, InvalidPath):
            return
        try:
            os.fsync(fd)
        finally:
            self._release(fd)

    # -- moving -------------------------------------------------------------------

    def rename(self, rel: str, target: Dir, target_rel: str, *, create_dirs: bool = True) -> None:
        """Rename `rel` to `target_rel` under `target` (another `Dir` of Sparkpoint's, or
        this one), replacing a file there. Neither end is reached through a link; an
        entry that is itself a link is moved as the link, never followed.

        :raises FileNotFoundError: `rel` is missing.
        :raises InvalidPath: a directory on the way of either end is a link.
        """
        src_fd, src_name, _src_names = self._parent(rel)
        try:
            dst_fd, dst_name, _dst_names = target._parent(target_rel, create_dirs)
        except BaseException:
            self._release(src_fd)
            raise
        try:
            os.replace(src_name, dst_name, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        finally:
            self._release(src_fd)
            target._release(dst_fd)

    def link_to(self, rel: str, target: Dir, target_rel: str, *, replace: bool = False,
                sync: bool = False) -> os.stat_result | None:
        """Hard-link the regular file `rel` to `target_rel` under `target`; its status, or
        None when it is not a regular file reached without a link, or cannot be linked
        (missing, another filesystem, links not allowed). The new name never holds a link.
        With `replace` an existing `target_rel` is replaced (a linked temp name renamed
        over it), with `sync` its directory is synced.
        """
        try:
            src_fd, src_name, _names = self._parent(rel)
        except (OSError, InvalidPath):
            return None
        try:
            dst_fd, dst_name, _dst_names = target._parent(target_rel, True)
        except (OSError, InvalidPath):
            self._release(src_fd)
            return None
        name = f"{TMP_MARK}{uuid.uuid4().hex}" if replace else dst_name
        try:
            st = os.stat(src_name, dir_fd=src_fd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):
                return None
            os.link(src_name, name, src_dir_fd=src_fd, dst_dir_fd=dst_fd, follow_symlinks=False)
            linked = os.stat(name, dir_fd=dst_fd, follow_symlinks=False)
            if not stat.S_ISREG(linked.st_mode):  # replaced by a link between the check and the link
                _fdops.unlink_quietly(name, dst_fd)
                return None
            if replace:
                try:
                    os.replace(name, dst_name, src_dir_fd=dst_fd, dst_dir_fd=dst_fd)
                except OSError:
                    _fdops.unlink_quietly(name, dst_fd)
                    raise
            if sync:
                os.fsync(dst_fd)
            return linked
        except OSError:
            return None
        finally:
            self._release(src_fd)
            target._release(dst_fd)

    # -- deleting -----------------------------------------------------------------

    def unlink(self, rel: str, *, prune_to: str | None = None) -> bool:
        """Remove the file (or link) `rel`; whether it was there. With `prune_to` (a
        directory on `rel`'s way, ``""``: this one), the directories between it and `rel`
        that are left empty are removed too.

        :raises IsADirectoryError: `rel` is a directory.
        :raises InvalidPath: a directory on its way is a link.
        """
        names = parts(rel)
        if not names:
            raise InvalidPath(f"{rel!r} names the directory {self.path} itself; expected a path below it")
        keep = len(parts(prune_to)) if prune_to is not None else len(names) - 1
        chain = [self.fd]
        try:
            for index, name in enumerate(names[:-1]):
                try:
                    chain.append(os.open(name, _fdops.DIR, dir_fd=chain[-1]))
                except OSError as exc:
                    error = self._refused(exc, names[:index + 1], chain[-1])
                    if isinstance(error, (FileNotFoundError, NotADirectoryError)):
                        return False
                    raise error from None
            try:
                os.unlink(names[-1], dir_fd=chain[-1])
            except (FileNotFoundError, NotADirectoryError):
                return False
            except OSError as exc:
                if exc.errno in (errno.EISDIR, errno.EPERM) and self.is_dir(rel):
                    raise IsADirectoryError(errno.EISDIR, "is a directory", self._join(names)) from None
                raise
            for depth in range(len(names) - 1, keep, -1):
                try:
                    os.rmdir(names[depth - 1], dir_fd=chain[depth - 1])
                except OSError:
                    break  # not empty (or gone): the ones above are not empty either
            return True
        finally:
            for fd in chain[1:]:
                _fdops.close_quietly(fd)

    def remove_tree(self, rel: str) -> bool:
        """Delete `rel` and everything below it, from descriptors: a link met inside is
        unlinked, never descended; `rel` itself being a link is unlinked. Whether it was
        there.

        :raises InvalidPath: a directory on the way to `rel` is a link (nothing is deleted).
        """
        try:
            dir_fd, name, _names = self._parent(rel)
        except (FileNotFoundError, NotADirectoryError):
            return False
        try:
            return _fdops.remove_entry(dir_fd, name)
        finally:
            self._release(dir_fd)

    def clear(self, keep: tuple[str, ...] = ()) -> None:
        """Delete everything in this directory but the names in `keep` (as `remove_tree`)."""
        for entry in self.entries():
            if entry.name not in keep:
                self.remove_tree(entry.name)


def open_path(path: str) -> tuple[BinaryIO, os.stat_result]:
    """The regular file at `path`, a path a caller made or just listed itself (a temp file,
    a live file): its directories are resolved by the system, the file itself is not
    followed if it is a link, and anything but a regular file is refused before a read.

    :raises FileNotFoundError: it is missing.
    :raises InvalidPath: it is a link or not a regular file.
    """
    directory, name = os.path.split(os.path.abspath(path))
    with Dir(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), directory) as parent:
        return parent.open_file(name)


def remove_tree_at(path: str) -> bool:
    """`Dir.remove_tree` of the tree at `path` (its directories resolved by the system: a
    temp directory this process made, or a root of Sparkpoint's); whether it was there."""
    directory, name = os.path.split(os.path.abspath(path))
    try:
        parent = Dir(os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    with parent:
        return parent.remove_tree(name)
