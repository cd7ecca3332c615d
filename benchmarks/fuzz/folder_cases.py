"""Hostile run folders and diagnose texts for benchmarks/fuzz/fuzz_folders.py and the in-suite sample.

A case starts from a real run folder (tests/data/runfolder: `moe-overlap verify --steps 3` on 2 CPU ranks) copied
into a sandbox beside an ``outside/`` folder of victim files, and changes one to three things in it: a file
replaced by a link out of the folder, a dangling link into outside/ (what a writer following it would create),
a symlink loop, a FIFO, /dev/zero, a directory, a 2 GB sparse file, non-UTF-8 or random bytes, a truncation; a
JSON field set to a hostile value (NaN, Infinity, 1e309, 1e-320, a 5000-digit integer, a 10,000-deep nesting, a
list where a number stands, ...); hostile record lines. Seeded: `random.Random(seed)`, so a case is reproducible.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "tests" / "data" / "runfolder"

JSON_FILES = ("plan.json", "config.json")
RECORDS = ("ranks/rank0.jsonl", "ranks/rank1.jsonl")
LOGS = tuple(f"logs/{m}/rank{r}.log" for m in ("baseline", "overlap", "overlap+wgrad") for r in (0, 1))
OUTPUTS = ("report.md", "report.json", "loss.png")
DIRS = ("ranks", "logs", "logs/baseline")
MARKER = ".moe-overlap-run.json"

RAW = "__RAW__"
RAW_TOKENS = ("NaN", "Infinity", "-Infinity", "1e309", "-1e400", "1e-320", "9" * 5000, "-" + "7" * 4301,
              "[" * 10000 + "]" * 10000, '{"a":' * 3000 + "1" + "}" * 3000, "1" + "0" * 39)
VALUES = (None, True, False, "", "x", "🙂" * 50, "a" * 100_000, [], {}, [1.5], {"a": [None]}, -1, 0, 1, 2**63,
          -(2**31), 1e-320, 5e-324, 1e300, 0.0, -0.0, [[[[[]]]]], "NaN", "-1", "1e309")
FILE_KINDS = ("link_out", "dangling_out", "loop", "fifo", "devzero", "devnull", "dir", "nonutf8", "sparse_big",
              "empty", "truncated", "garbage")
DIR_KINDS = ("link_out_dir", "dangling_out", "loop", "file", "fifo")


def hostile_value(rng: random.Random):
    if rng.random() < 0.4:
        return RAW + str(rng.randrange(len(RAW_TOKENS)))
    return rng.choice(VALUES)


def dump(data) -> bytes:
    """JSON text with the raw tokens (not expressible as Python data: NaN spelled as such, huge ints) put in."""
    text = json.dumps(data)
    for i, tok in enumerate(RAW_TOKENS):
        text = text.replace(json.dumps(RAW + str(i)), tok)
    return text.encode("utf-8")


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data[:20]):
            yield from _paths(v, (*prefix, i))


def mutate_json(rng: random.Random, data, focus: tuple = ()):
    """`data` with one field (under `focus` when it exists) set to a hostile value, or removed."""
    paths = [p for p in _paths(data) if p and p[:len(focus)] == focus] or [p for p in _paths(data) if p]
    if not paths:
        return hostile_value(rng)
    path = rng.choice(paths)
    node = data
    for key in path[:-1]:
        node = node[key]
    if isinstance(node, dict) and rng.random() < 0.15:
        node.pop(path[-1], None)
    else:
        node[path[-1]] = hostile_value(rng)
    return data


def _victim(outside: Path, rng: random.Random) -> Path:
    victims = sorted(p for p in outside.iterdir() if p.is_file())
    return rng.choice(victims)


def _remove(path: Path) -> None:
    """Whatever is at `path` (a FIFO, a link, a file, a folder), never opened or followed."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()


def replace_file(rng: random.Random, path: Path, outside: Path, kind: str) -> None:
    if path.parent.is_symlink() or not path.parent.is_dir():
        return  # an earlier change of this case put something else where the file's folder was
    content = path.read_bytes() if path.is_file() and not path.is_symlink() else b"{}"
    _remove(path)
    if kind == "link_out":
        path.symlink_to(_victim(outside, rng))
    elif kind == "dangling_out":
        path.symlink_to(outside / f"created-{rng.randrange(10**6)}")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "devzero":
        path.symlink_to("/dev/zero")
    elif kind == "devnull":
        path.symlink_to("/dev/null")
    elif kind == "dir":
        path.mkdir()
    elif kind == "sparse_big":
        with open(path, "wb") as f:
            f.truncate(2 << 30)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "truncated":
        path.write_bytes(content[: rng.randrange(max(1, len(content)))])
    elif kind == "garbage":
        path.write_bytes(rng.randbytes(rng.randrange(1, 4096)))
    else:  # nonutf8
        cut = rng.randrange(max(1, len(content)))
        path.write_bytes(content[:cut] + b"\xff\xfe\xc3" + content[cut:])


def replace_dir(rng: random.Random, path: Path, outside: Path, kind: str) -> None:
    if path.parent.is_symlink() or not path.parent.is_dir():
        return
    _remove(path)
    if kind == "link_out_dir":
        path.symlink_to(outside / "tree", target_is_directory=True)
    elif kind == "dangling_out":
        path.symlink_to(outside / f"created-dir-{rng.randrange(10**6)}")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.write_bytes(b"not a folder")


def mutate_records(rng: random.Random, path: Path) -> None:
    if not path.is_file() or path.is_symlink():
        return
    lines = path.read_bytes().split(b"\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        try:
            rec = json.loads(lines[i])
        except (ValueError, RecursionError):
            rec = None
        if isinstance(rec, dict) and rng.random() < 0.7:
            lines[i] = dump(mutate_json(rng, rec))
        else:
            lines.insert(i, dump(hostile_value(rng)) if rng.random() < 0.5 else rng.randbytes(rng.randrange(200)))
    path.write_bytes(b"\n".join(lines))


def _json_of(path: Path):
    if not path.is_file() or path.is_symlink() or path.stat().st_size > 10 << 20:
        return None
    try:
        return json.loads(path.read_bytes())
    except (ValueError, RecursionError):
        return None


def make_sandbox(base: Path, rng: random.Random) -> tuple[Path, Path]:
    """(run folder, outside folder) under `base`, the run folder a copy of the template."""
    run, outside = base / "run", base / "outside"
    shutil.copytree(TEMPLATE, run, symlinks=True)
    (outside / "tree" / "ranks").mkdir(parents=True)
    for i in range(3):
        (outside / f"victim-{i}.json").write_bytes((TEMPLATE / "report.json").read_bytes()[: 2000 * (i + 1)])
    shutil.copy(TEMPLATE / "ranks" / "rank0.jsonl", outside / "tree" / "ranks" / "rank0.jsonl")
    shutil.copy(TEMPLATE / "plan.json", outside / "tree" / "plan.json")
    return run, outside


def judge_case(rng: random.Random, base: Path) -> tuple[list[str], str]:
    """A hostile folder for `verify --judge`; (argv, what was done)."""
    run, outside = make_sandbox(base, rng)
    done = []
    for _ in range(rng.randint(1, 3)):
        what = rng.random()
        if what < 0.25:
            rel = rng.choice((*JSON_FILES, *JSON_FILES, MARKER))
            p = run / rel
            if p.is_file() and not p.is_symlink():
                try:
                    p.write_bytes(dump(mutate_json(rng, json.loads(p.read_bytes()))))
                    done.append(f"field of {rel}")
                    continue
                except (ValueError, RecursionError):
                    pass
            kind = rng.choice(FILE_KINDS)
            replace_file(rng, p, outside, kind)
            done.append(f"{rel}: {kind}")
        elif what < 0.45:
            rel = rng.choice(RECORDS)
            mutate_records(rng, run / rel)
            done.append(f"lines of {rel}")
        elif what < 0.85:
            rel = rng.choice((*OUTPUTS, *OUTPUTS, *RECORDS, *LOGS))
            kind = rng.choice(FILE_KINDS)
            replace_file(rng, run / rel, outside, kind)
            done.append(f"{rel}: {kind}")
        else:
            rel = rng.choice(DIRS)
            kind = rng.choice(DIR_KINDS)
            replace_dir(rng, run / rel, outside, kind)
            done.append(f"{rel}/: {kind}")
    target = str(run)
    if rng.random() < 0.05:
        link = base / "run-link"
        link.symlink_to(run, target_is_directory=True)
        target = str(link)
    return ["verify", "--judge", target, "--format", "json"], "; ".join(done)


def from_run_case(rng: random.Random, base: Path) -> tuple[list[str], str]:
    """A hostile folder (or report.json) for `estimate --from-run`; (argv, what was done)."""
    run, outside = make_sandbox(base, rng)
    report = run / "report.json"
    done = []
    for _ in range(rng.randint(1, 3)):
        what = rng.random()
        data = _json_of(report) if what < 0.7 else None
        if data is not None:
            focus = rng.choice((("analysis", "pieces"), ("analysis", "pieces"), ("environment",), ("config",), ()))
            report.write_bytes(dump(mutate_json(rng, data, focus)))
            done.append(f"field under {'.'.join(focus) or '(top)'}")
        elif what < 0.95:
            kind = rng.choice(FILE_KINDS)
            replace_file(rng, report, outside, kind)
            done.append(f"report.json: {kind}")
        else:
            kind = rng.choice(DIR_KINDS)
            replace_dir(rng, run, outside, kind)
            done.append(f"run/: {kind}")
            break
    target = str(report if rng.random() < 0.3 else run)
    ep = rng.choice(("2", "8", "16", "64"))
    return (["estimate", "--model", rng.choice(("qwen3-30b-a3b", "deepseek-v3")), "--tokens", "4096", "--ep", ep,
             "--from-run", target, "--format", "json"], "; ".join(done))


_WORDS = ("deepep", "none", "overlap_moe_expert_parallel_comm", "NCCL", "timeout", "error", "cuda", "OOM", "hang",
          "delay_wgrad_compute", "AssertionError:", "alltoall", "flex", "hybridep", "1f1b", "a2a", "(", ")", "[",
          "*", "+", "?", "\\", ".*", "|", "{1000}", "é", "🙂", "\t", "\n", "\x1b[31m", "Traceback", "rank 3",
          "not supported with", "full recompute", "expert_model_parallel_size", "=", ":", "0" * 50)


def diagnose_text(rng: random.Random) -> str:
    """A hostile symptom text, at most 64 KiB of UTF-8 (the MCP tool's cap): repeated vocabulary, regex
    metacharacters, unicode."""
    return _text(rng).encode("utf-8")[: 64 << 10].decode("utf-8", "ignore")


def _text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        unit = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 4))) + " "
        return unit * rng.randint(1, max(1, 60_000 // max(1, len(unit.encode()))))
    if kind < 0.6:
        return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3000)))
    if kind < 0.8:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randint(1, 5000)))
    return rng.choice(_WORDS) * rng.randint(1, 20000)
