"""The descriptor routines of `storage.localfs` (no paths here: every argument is an open
descriptor, an open file or a name in an open directory): a tree walked and emptied
without following a link, bytes read bounded, copied and compared. Only `localfs` uses
them."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from typing import BinaryIO

from airflow_sparkpoint.exceptions import ObjectTooLarge

#: a directory below an open one, never through a link
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: a file to read: never a link, never blocking (a FIFO opens at once and is refused)
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
#: a new temp file
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1024 * 1024


def close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def walk_tree(top: int, skip: Callable[[str, bool], bool] | None) -> Iterator[tuple[str, os.stat_result]]:
    """Every regular file below the directory open as `top` (which this closes), as (path
    relative to it, status), depth first without recursion; links and FIFOs are left
    out, a link is never descended, `skip` (name, is a directory) leaves entries out."""
    stack: list[tuple[int, str]] = [(top, "")]
    try:
        while stack:
            fd, prefix = stack.pop()
            try:
                with os.scandir(fd) as found:
                    listed = list(found)
                for entry in listed:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            if skip is None or not skip(entry.name, True):
                                stack.append((os.open(entry.name, DIR, dir_fd=fd), f"{prefix}{entry.name}/"))
                        elif (entry.is_file(follow_symlinks=False)
                                and (skip is None or not skip(entry.name, False))):
                            yield f"{prefix}{entry.name}", entry.stat(follow_symlinks=False)
                    except (FileNotFoundError, NotADirectoryError):
                        continue  # deleted meanwhile
                    except OSError as exc:
                        if exc.errno != errno.ELOOP:
                            raise
                        continue  # a directory replaced by a link meanwhile: not descended
            finally:
                close_quietly(fd)
    finally:
        for fd, _prefix in stack:
            close_quietly(fd)


def read_bounded(handle: BinaryIO, size: int, max_bytes: int, where: str) -> bytes:
    """Everything `handle` (a regular file of `size` bytes, as its fstat said) holds, read
    in chunks; over `max_bytes` (now or grown while read) is `ObjectTooLarge` naming `where`."""
    if size > max_bytes:
        raise ObjectTooLarge(f"{where} is {size} bytes, over the limit of {max_bytes} "
                             "bytes for its kind of file; "
                             "treated as corrupt")
    chunks = []
    total = 0
    while chunk := handle.read(min(CHUNK, max_bytes + 1 - total)):
        chunks.append(chunk)
        total += len(chunk)
        if total > max_bytes:
            raise ObjectTooLarge(f"{where} grew past the limit of {max_bytes} bytes while "
                                 "it was read; treated as "
                                 "corrupt")
    return b"".join(chunks)


def bounded_lines(handle: BinaryIO, max_line: int, where: str) -> Iterator[bytes]:
    """The lines of `handle` without their line breaks; a line longer than `max_line` is
    `ObjectTooLarge` naming `where` (memory bounded, whatever the file's size)."""
    while line := handle.readline(max_line + 1):
        if len(line) > max_line and not line.endswith(b"\n"):
            raise ObjectTooLarge(f"{where} has a line longer than {max_line} bytes; treated as corrupt")
        yield line.rstrip(b"\n")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def same_file(dir_fd: int, tmp: str, name: str) -> bool:
    """Whether the regular file `name` holds the bytes of `tmp` (both in `dir_fd`)."""
    try:
        old = os.open(name, READ, dir_fd=dir_fd)
    except OSError:
        return False
    try:
        new = os.open(tmp, READ, dir_fd=dir_fd)
        try:
            a, b = os.fstat(old), os.fstat(new)
            if not stat.S_ISREG(a.st_mode) or a.st_size != b.st_size:
                return False
            while True:
                chunk = os.read(new, CHUNK)
                if chunk != os.read(old, len(chunk) or 1):
                    return False
                if not chunk:
                    return True
        finally:
            close_quietly(new)
    finally:
        close_quietly(old)


def unlink_quietly(name: str, dir_fd: int) -> bool:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def remove_entry(dir_fd: int, name: str) -> bool:
    """Delete `name` in the directory open as `dir_fd`: a directory with everything below
    it (`remove_contents`), a file, or a link (unlinked, never followed). Whether it was
    there."""
    try:
        child = os.open(name, DIR, dir_fd=dir_fd)
    except (FileNotFoundError, NotADirectoryError):
        return unlink_quietly(name, dir_fd)  # missing, a file, or a link (ENOTDIR with O_DIRECTORY)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        return unlink_quietly(name, dir_fd)  # a link: unlinked, never followed
    try:
        remove_contents(child)
    finally:
        close_quietly(child)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    return True


def remove_contents(top: int) -> None:
    """Empty the directory open as `top`, depth first without recursion (a planted tree
    may be deeper than Python's stack)."""
    with os.scandir(top) as found:
        stack: list[tuple[int, str | None, list[os.DirEntry[str]]]] = [(top, None, list(found))]
    try:
        while stack:
            fd, name, pending = stack[-1]
            if not pending:
                stack.pop()
                if name is not None:
                    close_quietly(fd)
                    try:
                        os.rmdir(name, dir_fd=stack[-1][0])
                    except FileNotFoundError:
                        pass
                continue
            entry = pending.pop()
            try:
                if entry.is_dir(follow_symlinks=False):
                    child = os.open(entry.name, DIR, dir_fd=fd)
                    try:
                        with os.scandir(child) as found:
                            stack.append((child, entry.name, list(found)))
                    except BaseException:
                        close_quietly(child)
                        raise
                else:
                    os.unlink(entry.name, dir_fd=fd)
            except (FileNotFoundError, NotADirectoryError):
                unlink_quietly(entry.name, fd)  # gone, or a directory replaced by a file meanwhile
            except OSError as exc:
                if exc.errno != errno.ELOOP:
                    raise
                unlink_quietly(entry.name, fd)  # replaced by a link meanwhile: the link goes
    finally:
        for fd, name, _pending in stack:
            if name is not None:
                close_quietly(fd)


def copy(src: int, dst: int) -> None:
    """Copy everything from `src` (at its position) to `dst`: in the kernel when it can."""
    try:
        while os.sendfile(dst, src, None, 64 * CHUNK):
            pass
        return
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSOCK, errno.EOPNOTSUPP, errno.EXDEV):
            raise
    while chunk := os.read(src, CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(dst, view):]
