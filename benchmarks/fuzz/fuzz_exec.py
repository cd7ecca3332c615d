"""Running `moe-overlap` command lines for benchmarks/fuzz/fuzz.py: in this process under a time limit, in a spawned
worker whose own peak memory is measured (killed and replaced on a hang), or as a fresh subprocess."""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIMIT_S = 10.0


class TimedOut(Exception):
    pass


@dataclass
class Outcome:
    code: int | None
    stdout: str
    stderr: str
    seconds: float
    crash: str | None = None  # the traceback of an exception nothing handled


def strict_json(text: str) -> bool:
    def refuse(name):
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


@contextlib.contextmanager
def time_limit(seconds: float):
    def on_alarm(signum, frame):
        raise TimedOut(f"over {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: list[str], stdin: bytes = b"", limit_s: float = LIMIT_S * 3) -> Outcome:
    """`moe-overlap ARGV` in this process: exit code, captured output, time, and any unhandled exception."""
    from moe_overlap.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_in = sys.stdin
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin))
    t0 = time.perf_counter()
    code, crash = None, None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), time_limit(limit_s):
            code = main(argv)
    except TimedOut:
        code = None
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 - exactly what the fuzz looks for
        crash = traceback.format_exc()
        code = 1
    finally:
        sys.stdin = old_in
    return Outcome(code, out.getvalue(), err.getvalue(), time.perf_counter() - t0, crash)


def _worker_main(conn) -> None:
    """The process that handles the inputs: it runs each command line and reports its outcome and its own peak
    RSS, so the memory measured is the CLI's, not the fuzzer's (hypothesis keeps its own bookkeeping)."""
    while True:
        try:
            argv, stdin = conn.recv()
        except EOFError:
            return
        out = run_cli(argv, stdin)
        conn.send((out.code, out.stdout, out.stderr, out.seconds, out.crash,
                   resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


class Handler:
    """A spawned worker running `moe-overlap` command lines one after another; killed and replaced when an
    input takes longer than `limit_s` (a hang is counted, not waited for). `worker` is the process's function
    (fuzz_folders.py passes one that swaps the loss plot for a stand-in)."""

    def __init__(self, worker=None, limit_s: float = LIMIT_S * 3) -> None:
        self.peak_rss_mb = 0.0
        self._worker = worker or _worker_main
        self._limit_s = limit_s
        self._start()

    def _start(self) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=self._worker, args=(child,), daemon=True)
        self._proc.start()
        child.close()

    def run(self, argv: list[str], stdin: bytes) -> Outcome:
        t0 = time.perf_counter()
        self._conn.send((argv, stdin))
        if not self._conn.poll(self._limit_s):
            self._proc.kill()
            self._proc.join()
            self._start()
            return Outcome(None, "", "", time.perf_counter() - t0)
        code, stdout, stderr, seconds, crash, rss = self._conn.recv()
        self.peak_rss_mb = max(self.peak_rss_mb, rss)
        return Outcome(code, stdout, stderr, seconds, crash)

    def close(self) -> None:
        self._conn.close()
        self._proc.join(10)


def run_cli_process(argv: list[str], stdin: bytes = b"") -> Outcome:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, "-m", "moe_overlap.cli", *argv], input=stdin, capture_output=True,
                              timeout=LIMIT_S * 3, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Outcome(None, "", "", time.perf_counter() - t0)
    return Outcome(proc.returncode, proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace"),
                   time.perf_counter() - t0)
