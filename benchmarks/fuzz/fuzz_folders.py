#!/usr/bin/env python3
"""Fuzz the surfaces that read a run folder, and diagnose's matching; count what issue 34 forbids.

    python benchmarks/fuzz/fuzz_folders.py [--judge 3000] [--from-run 3000] [--diagnose 6000] [--seed 0]
                                          [--subprocess-sample 30] [--out benchmarks/results/fuzz_folders.json]

Per surface: inputs, tracebacks (an exception no command turned into a clear error, or an exit code outside
0/1/2), inputs over 10 s, the slowest, the peak RSS of the process that ran them, `--format json` outputs that
are not strict JSON, and files created or changed outside the run folder: each case runs in a sandbox (the run
folder, an ``outside/`` folder of victim files it links to, the worker's empty working folder), snapshotted
(lstat of every entry: kind, size, mtime) before and after; anything different outside run/ is counted.
Cases (benchmarks/fuzz/folder_cases.py) are seeded; another --seed is a held-out run of the same kind. They run
in a spawned worker calling the CLI's main() (killed and replaced on a hang), a sample also as real processes;
the worker draws the real loss.png on every PLOT_EVERY-th case and writes a stand-in through the same writer on
the others (matplotlib's ~1 s per plot would make 3000 folders take an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import folder_cases as fc  # noqa: E402
from benchmarks.fuzz.fuzz_exec import LIMIT_S, Handler, Outcome  # noqa: E402
from benchmarks.fuzz.tally import Tally, write_results  # noqa: E402


def snapshot(base: Path, skip: str = "run") -> dict[str, tuple]:
    """Every entry under `base` except the run folder: (kind bits, size, mtime_ns), links never followed."""
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        rel_dir = os.path.relpath(dirpath, base)
        if rel_dir == skip or rel_dir.startswith(skip + os.sep):
            dirnames[:] = []
            continue
        for name in dirnames + filenames:
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if rel == skip:
                continue
            st = os.lstat(os.path.join(dirpath, name))
            seen[rel] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return seen


def _process(argv: list[str], cwd: Path) -> Outcome:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "moe_overlap.cli", *argv], capture_output=True,
                              timeout=LIMIT_S + 1, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        return Outcome(None, "", "", time.perf_counter() - t0)
    return Outcome(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
                   time.perf_counter() - t0)


PLOT_EVERY = 10  # every 10th case draws the real loss.png (matplotlib: ~1 s); the others write a stand-in


def _quick_plot(report, path):
    """A stand-in for plot_losses with the same write path (verify/rundir/write.py) and no drawing."""
    from moe_overlap.verify.rundir.write import write_bytes

    write_bytes(path.parent, path.name, b"\x89PNG stand-in")
    return None


def _worker_main(conn) -> None:
    """fuzz_exec's worker, with the plot swapped for its stand-in on all but every PLOT_EVERY-th case."""
    import resource

    from benchmarks.fuzz.fuzz_exec import run_cli
    from moe_overlap.verify.judge import report

    real_plot = report.plot_losses
    n = 0
    while True:
        try:
            argv, stdin = conn.recv()
        except EOFError:
            return
        report.plot_losses = real_plot if n % PLOT_EVERY == 0 else _quick_plot
        n += 1
        out = run_cli(argv, stdin)
        conn.send((out.code, out.stdout, out.stderr, out.seconds, out.crash,
                   resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def fuzz_surface(surface: str, count: int, seed_value: int, subprocess_sample: int, work: Path) -> dict:
    tally = Tally(surface)
    outside_changes, created_in_cwd = 0, 0
    cwd = work / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)  # the worker inherits it: a stray ./verify-out would show here
    # a hang is cut at LIMIT_S + 1 s: it counts as over the limit whatever it would have taken
    handler = Handler(worker=_worker_main, limit_s=LIMIT_S + 1)
    every = max(1, count // subprocess_sample) if subprocess_sample else 0
    t0 = time.perf_counter()
    for i in range(count):
        rng = random.Random(f"{surface}-{seed_value}-{i}")
        base = Path(tempfile.mkdtemp(prefix=f"{surface}-", dir=work))
        try:
            if surface == "diagnose":
                text = fc.diagnose_text(rng)
                argv, what = ["diagnose", text, "--format", "json"], f"diagnose text of {len(text)} chars"
            else:
                try:
                    argv, what = (fc.judge_case if surface == "judge" else fc.from_run_case)(rng, base)
                except OSError as exc:  # the case's own changes collided (a folder already replaced): none made
                    print(f"{surface} #{i}: case not made ({exc})", file=sys.stderr)
                    continue
            before = snapshot(base)
            real = bool(every) and i % every == 0 and "fifo" not in what
            out = _process(argv, cwd) if real else handler.run(argv, b"")
            if real:
                tally.subprocess_checked += 1
            after = snapshot(base)
            changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
            problem = None
            if changed:
                outside_changes += 1
                problem = f"changed outside the folder: {changed[:5]}"
            if os.listdir(cwd):
                created_in_cwd += 1
                problem = f"created in the working folder: {os.listdir(cwd)[:5]}"
                for name in os.listdir(cwd):
                    shutil.rmtree(cwd / name, ignore_errors=True)
            case = f"#{i} {what}: {' '.join(a[:80] for a in argv[:6])}"
            tally.add(case, out, json_expected=True, problem=problem)
        finally:
            shutil.rmtree(base, ignore_errors=True)
        if (i + 1) % 500 == 0:
            print(f"{surface}: {i + 1}/{count}, {tally.tracebacks} problems, {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    handler.close()
    row = dict(tally.__dict__)
    row.update(outside_changes=outside_changes, created_in_cwd=created_in_cwd,
               peak_rss_mb=round(handler.peak_rss_mb, 1), wall_s=round(time.perf_counter() - t0, 1))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--judge", type=int, default=3000, help="hostile folders for verify --judge (default 3000)")
    ap.add_argument("--from-run", type=int, default=3000, help="hostile folders for estimate --from-run")
    ap.add_argument("--diagnose", type=int, default=6000, help="hostile texts for diagnose (default 6000)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--subprocess-sample", type=int, default=30, help="cases per surface also run as a real process")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="fuzz-folders-"))
    rows = []
    try:
        for surface, count in (("judge", args.judge), ("from-run", args.from_run), ("diagnose", args.diagnose)):
            if count:
                rows.append(fuzz_surface(surface, count, args.seed, args.subprocess_sample, work))
    finally:
        os.chdir(ROOT)
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        codes = ", ".join(f"{k}:{v}" for k, v in sorted(r["exit_codes"].items()))
        print(f"{r['parser']:<9} inputs {r['inputs']:>5}  tracebacks {r['tracebacks']}  >10 s {r['over_limit']}  "
              f"slowest {r['slowest_s']:.2f} s  peak RSS {r['peak_rss_mb']:.0f} MB  bad JSON {r['bad_json']}  "
              f"outside changed {r['outside_changes']}  exit codes {codes}  ({r['subprocess_checked']} as processes)")
        for ex in r["examples"]:
            print(f"  [{r['parser']}] {ex[:1500]}")
    if args.out:
        write_results(args.out, "benchmarks/fuzz/fuzz_folders.py", sys.argv[1:], args.seed, rows)
    bad = sum(r["tracebacks"] + r["over_limit"] + r["bad_json"] + r["outside_changes"] + r["created_in_cwd"]
              + (r["peak_rss_mb"] > 1024) for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
