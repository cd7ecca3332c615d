"""Reading a run folder's files: one way for --judge, --from-run, the MCP job resources and the launchers.

    from moe_overlap.verify.rundir.read import read_model, read_records, RunFolderError
    plan = read_model(out, "plan.json", PlanFile)          # RunFolderError names the file and the field
    recs = read_records(out, "ranks/rank0.jsonl", RankRecord)

The rules, for a folder written by processes we do not control:
- only regular files: a FIFO would block the reader, /dev/zero or a directory never ends or is not a file;
- no symbolic link is followed out of the folder: the folder path itself may be a link (it is resolved once),
  a parent inside it is resolved and must stay inside, the file itself is opened with O_NOFOLLOW (a link
  there is refused);
- the size is checked on the open descriptor (fstat) before anything is read, and the read is bounded anyway;
- JSON is strict (strict_json.py), and each record is validated into its pydantic model: the error names
  the file, the field, what was wrong and the fix.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from moe_overlap.skill.files import FileRefused, open_regular, read_head_tail_fd, read_limited_fd
from moe_overlap.verify.rundir.strict_json import StrictJSONError, loads

MAX_JSON_BYTES = 16 << 20  # report.json of 100,000 steps x 3 modes is about 40 MB in records, far less here
MAX_RECORDS_BYTES = 256 << 20  # one rank's records: 100,000 steps x 3 modes is about 60 MB
MAX_RECORD_LINE = 1 << 20  # one record line (a traceback record is the longest: a few KB)
MAX_LOG_BYTES = 8 << 20  # a training log as check-logs reads it: head and tail beyond this

M = TypeVar("M", bound=BaseModel)


class RunFolderError(ValueError):
    """A run folder's file cannot be used: `message` names the file (and field); `fix` says what to do."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None,
                 fix: str | None = None):
        super().__init__(message)
        self.message, self.file, self.field = message, file, field
        self.fix = fix or "judge a folder a moe-overlap run wrote; do not edit or replace its files by hand"


def folder_root(folder: str | os.PathLike[str]) -> Path:
    """The folder, resolved once (a symlinked folder is fine); RunFolderError if it is not a directory."""
    if str(folder) == "":
        raise RunFolderError("an empty folder name", fix="give the run folder's path")
    try:
        root = Path(folder).resolve(strict=True)
    except (OSError, RuntimeError) as exc:  # missing, a dangling link, a symlink loop
        why = "no such folder" if isinstance(exc, FileNotFoundError) else getattr(exc, "strerror", None) or str(exc)
        raise RunFolderError(f"{folder}: {why}", fix="give the run folder's path") from None
    if not root.is_dir():
        raise RunFolderError(f"{folder}: not a folder", fix="give the run folder's path")
    return root


def _parent_fd(root: Path, rel: str) -> tuple[int, str] | None:
    """(descriptor of the file's folder, leaf name), the folder checked to lie inside `root`; None if missing."""
    parts = Path(rel).parts
    if not parts or Path(rel).is_absolute() or ".." in parts:
        raise RunFolderError(f"{rel}: not a path inside the run folder")
    parent = root.joinpath(*parts[:-1])
    try:
        real = parent.resolve(strict=True)
    except FileNotFoundError:
        return None
    except (OSError, RuntimeError) as exc:
        raise RunFolderError(f"{root / rel}: its folder cannot be resolved ({getattr(exc, 'strerror', None) or exc})",
                             file=rel) from None
    if real != root and root not in real.parents:
        raise RunFolderError(f"{root / rel}: {Path(*parts[:-1])} is a symbolic link out of the run folder "
                             f"(to {real}); files outside it are never read", file=rel)
    try:
        fd = os.open(real, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except NotADirectoryError:
        raise RunFolderError(f"{root / rel}: {Path(*parts[:-1])} is not a folder", file=rel) from None
    except OSError as exc:
        raise RunFolderError(f"{root / rel}: cannot open its folder ({exc.strerror})", file=rel) from None
    return fd, parts[-1]


def exists(folder: str | os.PathLike[str], rel: str) -> bool:
    """Something (a file, a link, anything) is at `rel`: lstat, never following a link."""
    try:
        os.lstat(Path(folder) / rel)
    except (OSError, ValueError):
        return False
    return True


def open_file(folder: str | os.PathLike[str], rel: str, *, what: str = "file") -> int | None:
    """A read-only descriptor of the regular file `rel` inside `folder` (None when nothing is there)."""
    root = folder_root(folder)
    got = _parent_fd(root, rel)
    if got is None:
        return None
    dir_fd, leaf = got
    try:
        try:
            st = os.lstat(leaf, dir_fd=dir_fd)
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(st.st_mode):
            raise RunFolderError(f"{root / rel}: is a symbolic link; a run folder's {what} is read only as a plain "
                                 "file, never through a link", file=rel)
        try:
            return open_regular(leaf, dir_fd=dir_fd, nofollow=True, what=what)
        except FileRefused as exc:
            raise RunFolderError(f"{root / rel}: {exc.message.split(': ', 1)[-1]}", file=rel) from None
    finally:
        os.close(dir_fd)


def read_bytes(folder: str | os.PathLike[str], rel: str, max_bytes: int, *, what: str = "file") -> bytes | None:
    """The whole file (None when missing); RunFolderError when it is not a plain file or over `max_bytes`."""
    fd = open_file(folder, rel, what=what)
    if fd is None:
        return None
    try:
        return read_limited_fd(fd, max_bytes, name=str(Path(folder) / rel), what=what)
    except FileRefused as exc:
        raise RunFolderError(exc.message, file=rel) from None
    except OSError as exc:
        raise RunFolderError(f"{Path(folder) / rel}: cannot read ({exc.strerror})", file=rel) from None
    finally:
        os.close(fd)


def parse_json(data: bytes, *, name: str, allow_nan: bool = False) -> Any:
    try:
        return loads(data, allow_nan=allow_nan)
    except StrictJSONError as exc:
        raise RunFolderError(f"{name}: {exc.message}", file=name) from None


def read_json(folder: str | os.PathLike[str], rel: str, *, max_bytes: int = MAX_JSON_BYTES,
              what: str = "file", allow_nan: bool = False) -> Any:
    """Strict JSON of the file `rel`; RunFolderError when it is missing, not a plain file or not strict JSON.

    `allow_nan`: NaN / Infinity constants pass (report.json: a diverged run's loss is written as NaN); the
    model that validates the data then decides where they may stand."""
    data = read_bytes(folder, rel, max_bytes, what=what)
    if data is None:
        raise RunFolderError(f"{Path(folder) / rel}: no such {what}", file=rel)
    return parse_json(data, name=str(Path(folder) / rel), allow_nan=allow_nan)


def validate(model: type[M], data: Any, *, name: str) -> M:
    """`data` as `model`, or RunFolderError naming the file and the first wrong field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise RunFolderError(f"{name}: {where}: {err['msg']}, got {_shown(err.get('input'))}", file=name,
                             field=where) from None


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 10**30:
        return "an integer of more than 30 digits"
    if isinstance(value, dict | list):
        return f"a {type(value).__name__} of {len(value)} items"
    text = repr(value)
    return text[:60] + ("..." if len(text) > 60 else "")


def read_model(folder: str | os.PathLike[str], rel: str, model: type[M], *, max_bytes: int = MAX_JSON_BYTES,
               what: str = "file") -> M:
    return validate(model, read_json(folder, rel, max_bytes=max_bytes, what=what), name=str(Path(folder) / rel))


def read_records(folder: str | os.PathLike[str], rel: str, model: type[BaseModel] | None = None, *,
                 max_bytes: int = MAX_RECORDS_BYTES) -> list[dict[str, Any]]:
    """The JSON-lines records of one rank (an empty list when the file is missing).

    A line that is torn, not JSON, too long or not a record (an object with a ``kind`` string and a finite
    time ``t``; valid as `model` when given) is skipped, as a killed rank leaves one: the judge reports the run
    from what the rank did write. NaN is accepted inside a record (a diverged loss is written so).
    """
    data = read_bytes(folder, rel, max_bytes, what="records file")
    if data is None:
        return []
    out = []
    for line in data.split(b"\n"):
        if not line.strip() or len(line) > MAX_RECORD_LINE:
            continue
        try:
            rec = loads(line, allow_nan=True)
        except StrictJSONError:
            continue
        if not (isinstance(rec, dict) and isinstance(rec.get("kind"), str) and isinstance(rec.get("t"), int | float)
                and not isinstance(rec.get("t"), bool) and abs(rec["t"]) < 1e12):
            continue
        if model is not None:
            try:
                rec = {**rec, **model.model_validate(rec).model_dump(exclude_unset=True)}
            except ValidationError:
                continue
        out.append(rec)
    return out


def read_text(folder: str | os.PathLike[str], rel: str, *, max_bytes: int = MAX_LOG_BYTES) -> str | None:
    """A log as text (invalid UTF-8 replaced): whole, or its head and tail beyond `max_bytes`; None if missing."""
    fd = open_file(folder, rel, what="log")
    if fd is None:
        return None
    try:
        head, tail, left = read_head_tail_fd(fd, max_bytes)
    except OSError as exc:
        raise RunFolderError(f"{Path(folder) / rel}: cannot read ({exc.strerror})", file=rel) from None
    finally:
        os.close(fd)
    text = head.decode("utf-8", errors="replace")
    if tail is not None:
        text += f"\n[... {left} bytes left out ...]\n" + tail.decode("utf-8", errors="replace")
    return text
