"""Reading a file a user (or a model driven by untrusted text) named: opened once, checked on the open descriptor,
read with a bound. Torch-free; used by the config loader, check-logs, the verify judge and the MCP server.

Why on the descriptor: a path checked first and opened later can change in between (a symlink swapped in), and a
FIFO, ``/dev/zero`` or a tty named as a file would block or never end. So the file is opened non-blocking (a FIFO
without a writer then opens at once), ``fstat`` of that descriptor must say "regular file", and at most
``max_bytes`` (+1, to tell "too big" from "exactly at the limit") are read from it, whatever ``st_size`` claims
(``/proc`` files report 0).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


class FileRefused(ValueError):
    """The path cannot be read as the kind of file asked for; `message` says why, `fix` what to give instead."""

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.message, self.fix = message, fix


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def open_regular(path: str | os.PathLike[str], *, dir_fd: int | None = None, nofollow: bool = False,
                 what: str = "file") -> int:
    """A read-only descriptor of the regular file at `path` (relative to `dir_fd` when given), or FileRefused.

    `nofollow`: the last component must not be a symbolic link (O_NOFOLLOW). The caller closes the descriptor.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
    if nofollow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        raise FileRefused(f"{path}: no such {what}", fix=f"check the path of the {what}") from None
    except IsADirectoryError:
        raise FileRefused(f"{path}: is a directory, not a {what}", fix=f"give the {what} itself") from None
    except OSError as exc:
        raise FileRefused(f"{path}: cannot open ({exc.strerror or exc})") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise FileRefused(f"{path}: is a directory, not a {what}", fix=f"give the {what} itself")
        if not stat.S_ISREG(mode):
            raise FileRefused(f"{path}: is {_kind(mode)}, not a regular {what}; only regular files are read",
                              fix=f"give a regular {what} (save the stream to a file first)")
        # Regular files ignore O_NONBLOCK; cleared anyway so nothing below depends on it.
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_fd(fd: int, limit: int) -> bytes:
    """Up to `limit` bytes from `fd`'s current offset (fewer only at end of file)."""
    chunks: list[bytes] = []
    left = limit
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_limited_fd(fd: int, max_bytes: int, *, name: str, what: str = "file") -> bytes:
    """The whole file behind `fd`, or FileRefused when it holds more than `max_bytes`."""
    size = os.fstat(fd).st_size
    if size > max_bytes:
        raise FileRefused(f"{name}: {size} bytes, over the {_human(max_bytes)} limit for a {what}",
                          fix=f"give the {what} itself, not a larger file")
    data = read_fd(fd, max_bytes + 1)
    if len(data) > max_bytes:  # grew while we read, or a pseudo-file that reports size 0
        raise FileRefused(f"{name}: more than {_human(max_bytes)}, over the limit for a {what}",
                          fix=f"give the {what} itself, not a larger file")
    return data


def read_limited(path: str | os.PathLike[str], max_bytes: int, *, what: str = "file") -> bytes:
    """Open `path` once (regular files only) and read it whole, refusing more than `max_bytes`."""
    fd = open_regular(path, what=what)
    try:
        return read_limited_fd(fd, max_bytes, name=str(path), what=what)
    finally:
        os.close(fd)


def read_head_tail_fd(fd: int, max_bytes: int) -> tuple[bytes, bytes | None, int]:
    """(head, tail, bytes left out) of the file behind `fd`, at most `max_bytes` in all.

    A file that fits comes back whole as `head` (tail None). A larger one keeps its first eighth and the rest
    from its end: a training log prints its effective config at the start and its failure at the end.
    """
    size = os.fstat(fd).st_size
    if size <= max_bytes:
        data = read_fd(fd, max_bytes + 1)
        if len(data) <= max_bytes:
            return data, None, 0
        # Larger than its size said (a file being written, a pseudo-file): slide a tail window over at most
        # three more budgets, so neither memory nor time depends on how long the file keeps growing.
        head = data[: max_bytes // 8]
        keep = max_bytes - len(head)
        tail, total = data[len(head):][-keep:], len(data)
        for _ in range(3):
            more = read_fd(fd, max_bytes)
            if not more:
                break
            total += len(more)
            tail = (tail + more)[-keep:]
        return head, tail, total - len(head) - len(tail)
    head = read_fd(fd, max_bytes // 8)
    tail_bytes = max_bytes - len(head)
    os.lseek(fd, size - tail_bytes, os.SEEK_SET)
    tail = read_fd(fd, tail_bytes)
    return head, tail, size - len(head) - len(tail)


def read_stream_limited(stream, max_bytes: int) -> tuple[bytes, bool]:
    """(data, cut) from a binary stream (stdin): at most `max_bytes`; `cut` when more was there."""
    data = stream.read(max_bytes + 1)
    return data[:max_bytes], len(data) > max_bytes


def has_suffix(path: str | os.PathLike[str], suffixes: tuple[str, ...]) -> bool:
    return Path(path).suffix.lower() in suffixes


def _human(n: int) -> str:
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000} MB"
    return f"{n} bytes"
