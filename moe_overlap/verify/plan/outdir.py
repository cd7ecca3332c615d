"""A verification run owns its output folder (torch-free).

Why: `--out` names a folder on a shared machine. Without ownership a run overwrote another tool's config.json,
`--force` deleted another tool's logs/ whenever a report.json was there, `--out / --force` wrote into `/`, and a run
into a killed run's folder appended to its records and reported its crash.

The rules (docs/limits.md):
- a run writes only into a folder it created, or one that holds our marker file (``MARKER``, written when the
  folder is claimed), or an empty folder it then marks;
- it refuses `/`, the home folder, and any other folder it did not make unless that folder is empty;
- a marked folder that holds an earlier run's outputs needs `--force`, and `--force` removes only what a run of
  ours writes there (the fixed names in OUTPUT_FILES, and rank files matching RANK_FILE / LOG_FILE in ranks/ and
  logs/<mode>/); anything else stays where it is;
- a symbolic link where we write (``logs``, ``ranks``, a report file) is never followed: the run is refused.
Rank files are then created exclusively (open mode "x"), so no run ever appends to or writes through an old file.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import time
from pathlib import Path

MARKER = ".moe-overlap-run.json"
OUTPUT_FILES = ("report.json", "report.md", "loss.png", "config.json", "plan.json", "job.sbatch", "cluster_job.json")
SLURM_OUT = re.compile(r"slurm-\d{1,12}\.out")  # a --launcher slurm job's output (#SBATCH --output)
OUTPUT_DIRS = ("ranks", "logs")
RANK_FILE = re.compile(r"rank\d{1,6}\.(?:jsonl|out|stacks)")
LOG_FILE = re.compile(r"rank\d{1,6}\.log")
MODES = ("baseline", "overlap", "overlap+wgrad")


class OutDirError(ValueError):
    """The folder cannot be used: `message` says why, `fix` what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return None


def _forbidden(path: Path) -> str | None:
    real = path.resolve()
    if real == Path(real.anchor):
        return "the filesystem root"
    home = Path.home().resolve()
    if real == home:
        return "your home folder"
    return None


def is_ours(out: Path) -> bool:
    """The folder holds our marker (a regular file, not a link)."""
    st = _lstat(out / MARKER)
    return st is not None and stat.S_ISREG(st.st_mode)


def earlier_outputs(out: Path) -> list[str]:
    """What an earlier run of ours left in `out` (names relative to it)."""
    found = [name for name in OUTPUT_FILES if _lstat(out / name) is not None]
    found += sorted(n for n in os.listdir(out) if SLURM_OUT.fullmatch(n)) if _is_real_dir(out) else []
    ranks = out / "ranks"
    if _is_real_dir(ranks):
        found += [f"ranks/{n}" for n in sorted(os.listdir(ranks)) if RANK_FILE.fullmatch(n)]
    logs = out / "logs"
    if _is_real_dir(logs):
        for mode in MODES:
            if _is_real_dir(logs / mode):
                found += [f"logs/{mode}/{n}" for n in sorted(os.listdir(logs / mode)) if LOG_FILE.fullmatch(n)]
    return found


def _is_real_dir(path: Path) -> bool:
    st = _lstat(path)
    return st is not None and stat.S_ISDIR(st.st_mode)


def _links(out: Path) -> list[str]:
    """Symbolic links (or other non-regular entries) where a run writes: never followed."""
    bad = []
    for name in (*OUTPUT_FILES, MARKER):
        st = _lstat(out / name)
        if st is not None and not stat.S_ISREG(st.st_mode):
            bad.append(name)
    for name in OUTPUT_DIRS:
        st = _lstat(out / name)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            bad.append(name)
    return bad


def check(out: Path, *, force: bool) -> None:
    """Raise OutDirError if a run may not write into `out` (nothing is changed here)."""
    where = _forbidden(out)
    if where is not None:
        raise OutDirError(f"--out {out} is {where}; a run writes only into its own folder",
                          "choose a new folder, e.g. --out ./verify-out/run1")
    st = _lstat(out)
    if st is None:
        if out.is_symlink():  # a dangling link: following it would create its target
            raise OutDirError(f"--out {out} is a dangling symbolic link", "choose a new folder")
        return
    if not out.is_dir():
        raise OutDirError(f"--out {out} exists and is not a folder", "choose a new folder")
    entries = os.listdir(out)
    if not entries:
        return
    if not is_ours(out):
        raise OutDirError(f"--out {out} is not empty and was not made by a moe-overlap run (no {MARKER}); "
                          "nothing there is touched", "choose a new or empty folder (--force only replaces what an "
                          "earlier moe-overlap run wrote)")
    links = _links(out)
    if links:
        raise OutDirError(f"--out {out}: {', '.join(links)} is a symbolic link or not a plain file/folder; "
                          "a run never writes through a link", f"remove {', '.join(links)} from {out}, or choose "
                          "a new folder")
    earlier = earlier_outputs(out)
    if earlier and not force:
        raise OutDirError(f"--out {out} holds an earlier run's outputs ({', '.join(earlier[:4])}"
                          f"{', ...' if len(earlier) > 4 else ''}); pass --force to replace them",
                          "pass --force to replace them (only files an earlier run wrote are removed), or choose "
                          "another --out")


def claim(out: Path, *, force: bool, run_id: str) -> Path:
    """Check, then create or take `out`: earlier outputs removed (with `force`), marker written, ranks/ and logs/
    created empty. Returns the folder's resolved path."""
    check(out, force=force)
    out.mkdir(parents=True, exist_ok=True)
    out = out.resolve()
    if is_ours(out):
        _remove_earlier(out)
    # Whatever still sits at a name a run writes (a folder named rank0.out, a file named logs/overlap) is not ours.
    leftovers = earlier_outputs(out) + [f"logs/{m}" for m in MODES
                                        if _lstat(out / "logs" / m) is not None and not _is_real_dir(out / "logs" / m)]
    if leftovers:
        raise OutDirError(f"--out {out}: {', '.join(leftovers[:4])} were not written by a moe-overlap run and sit "
                          "where the ranks write", "move them away, or choose a new folder")
    _write_marker(out, run_id)
    for name in OUTPUT_DIRS:
        (out / name).mkdir(exist_ok=True)
    return out


def _remove_earlier(out: Path) -> None:
    for name in earlier_outputs(out):
        path = out / name
        st = _lstat(path)
        if st is not None and (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            path.unlink()  # a link itself, never its target
    for mode in MODES:
        _rmdir_if_empty(out / "logs" / mode)
    for name in OUTPUT_DIRS:
        _rmdir_if_empty(out / name)


def _rmdir_if_empty(path: Path) -> None:
    if _is_real_dir(path):
        try:
            path.rmdir()
        except OSError:
            pass  # something of someone else's is inside: it stays


def _write_marker(out: Path, run_id: str) -> None:
    data = {"tool": "moe-overlap verify", "about": "this folder belongs to moe-overlap verification runs; "
            "--force replaces only the files they write", "run_id": run_id,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "pid": os.getpid(),
            "host": socket.gethostname()}
    tmp = out / f"{MARKER}.{os.getpid()}.tmp"
    with open(tmp, "x", encoding="utf-8") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.replace(tmp, out / MARKER)


def new_default_folder(base: Path) -> Path:
    """A fresh folder under `base` (./verify-out): unique per run, created here."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for _ in range(100):
        path = base / f"{stamp}-{os.getpid()}-{os.urandom(3).hex()}"
        if _lstat(path) is None:
            return path
    raise OutDirError(f"cannot find a free folder name under {base}", "pass --out DIR")
