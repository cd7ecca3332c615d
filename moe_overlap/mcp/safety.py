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

    @classmethod
    def from_paths(cls, paths: Sequence[str | os.PathLike[str]]) -> AllowedRoots:
        resolved = []
        for p in paths:
            path = Path(p).expanduser().resolve()
            if not path.is_dir():
                raise ValueError(f"allowed folder {str(p)!r} is not a directory")
            resolved.append(path)
        return cls(tuple(resolved))

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

    def resolve_file(self, raw: str, *, field: str) -> Path:
        """The real path of an existing regular file inside an allowed folder, or a ToolError naming `field`.

        Relative paths are taken from the first allowed folder. `..` components are refused outright
        (even when they would land inside), then the fully resolved path (symlinks followed) must still
        lie inside an allowed folder, so a symlink pointing outside is refused too.
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
        if not any(_is_within(candidate.absolute(), root) for root in self.roots):
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
        if not any(_is_within(real, root) for root in self.roots):
            raise ToolError(
                f"`{field}`: {raw!r} resolves (through a symbolic link) outside the allowed folders. "
                f"Fix: give the real file inside {self.describe()}."
            )
        if not real.is_file():
            raise ToolError(f"`{field}`: {raw!r} is not a regular file. Fix: give a file, not a folder.")
        return real


def _is_within(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
    except ValueError:
        return False
    return True


def read_text_file(path: Path, *, max_bytes: int) -> tuple[str, int]:
    """Read a file as UTF-8 (undecodable bytes replaced), at most `max_bytes` of it.

    Returns (text, bytes left out). A larger file keeps its head (1/8 of the budget) and its tail, with a
    marker line between them: a training log prints its effective config at the start and its failure
    at the end, and both matter.
    """
    size = path.stat().st_size
    with path.open("rb") as fh:
        if size <= max_bytes:
            return fh.read().decode("utf-8", errors="replace"), 0
        head = fh.read(max_bytes // 8)
        tail_bytes = max_bytes - len(head)
        fh.seek(size - tail_bytes)
        tail = fh.read(tail_bytes)
    omitted = size - len(head) - len(tail)
    text = (head.decode("utf-8", errors="replace") + f"\n[... {omitted} bytes of {path.name} omitted ...]\n"
            + tail.decode("utf-8", errors="replace"))
    return text, omitted


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
