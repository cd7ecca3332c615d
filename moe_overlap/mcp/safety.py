"""What a client may make the server read, and how much it may send or get back.

Why: an MCP client is driven by a model that reads untrusted text (logs, web pages). A path argument
must not become a way to read ``~/.ssh`` through ``..``, an absolute path or a symlink, and a huge
argument or result must not exhaust the server or the client's context window.
Torch-free.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mcp.server.mcpserver.exceptions import ToolError

from moe_overlap.skill.files import FileRefused, open_regular, read_head_tail_fd

# Input limits (characters). Big enough for a real config or a long log excerpt, small enough that
# one call cannot make the server hold hundreds of MiB.
MAX_CONFIG_CHARS = 256 * 1024
MAX_TEXT_CHARS = 64 * 1024  # error text / symptom given to diagnose_failure
MAX_LOG_CHARS = 4 * 1024 * 1024  # log text given inline to check_training_log
MAX_LOG_FILE_BYTES = 16 * 1024 * 1024  # a log file read from an allowed folder (head and tail kept beyond this)
MAX_OVERRIDES = 64
MAX_PATH_CHARS = 4096
# Output limits: a tool result larger than this crowds the model's context; long lists are cut and the
# result says where the full data is.
MAX_LIST_ITEMS = 50


@dataclass(frozen=True)
class AllowedRoots:
    """Folders whose files tools may read (config files, training logs). Resolved once at start-up."""

    roots: tuple[Path, ...]
    # The folders as given (absolute, links not resolved): a symlinked --allowed-dir (the repo's examples/) is
    # named by its link, so a path through it is inside; where it leads is then checked on the resolved roots.
    aliases: tuple[Path, ...] = ()

    @classmethod
    def from_paths(cls, paths: Sequence[str | os.PathLike[str]]) -> AllowedRoots:
        resolved, given = [], []
        for p in paths:
            path = Path(p).expanduser().resolve()
            if not path.is_dir():
                raise ValueError(f"allowed folder {str(p)!r} is not a directory")
            resolved.append(path)
            given.append(Path(os.path.abspath(Path(p).expanduser())))
        return cls(tuple(resolved), tuple(a for a in given if a not in resolved))

    @classmethod
    def default(cls) -> AllowedRoots:
        """The current folder, unless it is a filesystem root or the home folder (what a desktop client
        launching the server from `/` would otherwise expose): then none, and path arguments are refused."""
        cwd = Path.cwd().resolve()
        if cwd == Path(cwd.anchor) or cwd == Path.home().resolve():
            return cls(())
        return cls((cwd,))

    def describe(self) -> str:
        return ", ".join(str(r) for r in self.roots) or "none (start the server with --allowed-dir DIR)"

    def open_file(self, raw: str, *, field: str) -> tuple[int, Path]:
        """(read-only descriptor, real path) of an existing regular file inside an allowed folder, or a ToolError
        naming `field`. The caller closes the descriptor.

        Relative paths are taken from the first allowed folder. `..` components are refused outright (even when
        they would land inside); the fully resolved path (symlinks followed) must lie inside an allowed folder.
        Then the file is opened once, by walking that resolved path down from the allowed folder one component at
        a time with O_NOFOLLOW: a component swapped for a symbolic link after the check fails the open instead of
        leading outside (no check-then-open race). Everything read afterwards comes from this descriptor.
        """
        if not self.roots:
            raise ToolError(f"`{field}`: this server has no allowed folder, so it reads no files. Fix: pass the "
                            "content inline, or restart the server with --allowed-dir DIR.")
        if not raw or len(raw) > MAX_PATH_CHARS or "\x00" in raw:
            raise ToolError(f"`{field}`: not a usable path. Fix: give a file path under {self.describe()}.")
        candidate = Path(raw).expanduser()
        if ".." in candidate.parts:
            raise ToolError(
                f"`{field}`: '..' is not allowed in paths ({raw!r}). "
                f"Fix: give a path inside an allowed folder ({self.describe()}) without '..'."
            )
        if not candidate.is_absolute():
            candidate = self.roots[0] / candidate
        if not any(_is_within(Path(os.path.abspath(candidate)), root) for root in self.roots + self.aliases):
            raise ToolError(
                f"`{field}`: {raw!r} is outside the allowed folders. Fix: copy the file under one of "
                f"{self.describe()}, or start the server with --allowed-dir pointing at its folder."
            )
        try:
            real = candidate.resolve(strict=True)
        except (FileNotFoundError, NotADirectoryError):
            raise ToolError(f"`{field}`: no such file {raw!r} (looked in {self.describe()}). "
                            "Fix: check the path, or pass the content inline instead.") from None
        except (OSError, RuntimeError) as exc:  # symlink loop, permission
            raise ToolError(f"`{field}`: cannot resolve {raw!r}: {exc}. Fix: give a plain file path.") from None
        root = next((r for r in self.roots if _is_within(real, r)), None)
        if root is None:
            raise ToolError(
                f"`{field}`: {raw!r} resolves (through a symbolic link) outside the allowed folders. "
                f"Fix: give the real file inside {self.describe()}."
            )
        parts = real.relative_to(root).parts
        if not parts:
            raise ToolError(f"`{field}`: {raw!r} is not a regular file. Fix: give a file, not a folder.")
        return _open_below(root, parts, raw, field), real

    def resolve_file(self, raw: str, *, field: str) -> Path:
        """The real path of the file `open_file` opens (what it would read), checked the same way."""
        fd, real = self.open_file(raw, field=field)
        os.close(fd)
        return real


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_below(root: Path, parts: tuple[str, ...], raw: str, field: str) -> int:
    changed = ToolError(f"`{field}`: {raw!r} changed while it was being opened (a folder on its path was replaced, "
                        "e.g. by a symbolic link). Fix: give the path of a file that is not being moved.")
    try:
        dir_fd = os.open(root, _DIR_FLAGS)
    except OSError as exc:
        raise ToolError(f"`{field}`: the allowed folder {root} cannot be opened ({exc.strerror}).") from None
    try:
        for part in parts[:-1]:
            try:
                nxt = os.open(part, _DIR_FLAGS | getattr(os, "O_NOFOLLOW", 0), dir_fd=dir_fd)
            except OSError:
                raise changed from None
            os.close(dir_fd)
            dir_fd = nxt
        try:
            return open_regular(parts[-1], dir_fd=dir_fd, nofollow=True)
        except FileRefused as exc:
            if "not a regular" in exc.message or "is a directory" in exc.message:
                raise ToolError(f"`{field}`: {raw!r} is not a regular file. Fix: give a file, not a folder, "
                                "FIFO or device.") from None
            raise changed from None
    finally:
        os.close(dir_fd)


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def read_text_fd(fd: int, *, max_bytes: int, name: str) -> tuple[str, int]:
    """A file as UTF-8 (undecodable bytes replaced), at most `max_bytes` of it, from its open descriptor.

    Returns (text, bytes left out). A larger file keeps its head (1/8 of the budget) and its tail, with a
    marker line between them: a training log prints its effective config at the start and its failure
    at the end, and both matter.
    """
    head, tail, omitted = read_head_tail_fd(fd, max_bytes)
    if tail is None:
        return head.decode("utf-8", errors="replace"), 0
    return (head.decode("utf-8", errors="replace") + f"\n[... {omitted} bytes of {name} omitted ...]\n"
            + tail.decode("utf-8", errors="replace")), omitted


def read_text_file(path: Path, *, max_bytes: int) -> tuple[str, int]:
    """read_text_fd of a path (regular files only)."""
    fd = open_regular(path, what="log file")
    try:
        return read_text_fd(fd, max_bytes=max_bytes, name=Path(path).name)
    finally:
        os.close(fd)


def check_size(value: str, *, field: str, limit: int) -> None:
    if len(value) > limit:
        raise ToolError(
            f"`{field}` is {len(value)} characters; the limit is {limit}. Fix: send a shorter excerpt, or "
            "pass a file path under an allowed folder where the tool accepts one."
        )


def clip_list(items: list, limit: int = MAX_LIST_ITEMS) -> tuple[list, int]:
    """The first `limit` items and how many were left out."""
    if len(items) <= limit:
        return items, 0
    return items[:limit], len(items) - limit
