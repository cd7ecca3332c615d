"""Writing a run folder's files without ever following a link (report.md, report.json, loss.png, plan.json).

A name in the folder may hold a symbolic link put there by someone else (to a file elsewhere, or dangling):
opening it for writing would change or create a file outside the folder. So every file is written to a new
temporary file in the same folder (O_CREAT | O_EXCL | O_NOFOLLOW: nothing existing is opened) and then
renamed over the name with os.replace, which replaces a link rather than following it. A directory at the
name is refused. The reader does the same walk (read.py): the folder is resolved once, a file's folder must
lie inside it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from moe_overlap.verify.rundir.read import RunFolderError, _parent_fd, folder_root

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def write_with(folder: str | os.PathLike[str], rel: str, fill: Callable[[BinaryIO], None]) -> Path:
    """Create or replace the file `rel` in `folder` with what `fill(f)` writes into a binary file object."""
    root = folder_root(folder)
    got = _parent_fd(root, rel)
    if got is None:
        raise RunFolderError(f"{root / rel}: its folder does not exist", file=rel)
    dir_fd, leaf = got
    try:
        try:
            st = os.lstat(leaf, dir_fd=dir_fd)
            if stat.S_ISDIR(st.st_mode):
                raise RunFolderError(f"{root / rel}: a folder sits where the run writes this file", file=rel,
                                     fix=f"move {root / rel} away, or choose a new --out")
        except FileNotFoundError:
            pass
        tmp = f".{leaf}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        try:
            fd = os.open(tmp, _FLAGS, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            raise RunFolderError(f"{root / rel}: cannot write ({exc.strerror})", file=rel) from None
        try:
            with os.fdopen(fd, "wb") as f:
                fill(f)
            os.replace(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # replaces a link, never follows it
        except BaseException as exc:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
            if isinstance(exc, OSError):
                raise RunFolderError(f"{root / rel}: cannot write ({exc.strerror or exc})", file=rel) from None
            raise
    finally:
        os.close(dir_fd)
    return root / rel


def write_bytes(folder: str | os.PathLike[str], rel: str, data: bytes) -> Path:
    return write_with(folder, rel, lambda f: f.write(data))


def write_text(folder: str | os.PathLike[str], rel: str, text: str) -> Path:
    return write_bytes(folder, rel, text.encode("utf-8"))
