"""Spawn one process per rank, watch them, and never leave one behind (torch-free).

Watchdog: every record a rank writes is a heartbeat (records.py). A rank silent for ``hang_timeout_s``
after its first step (``startup_timeout_s`` before it: imports, rendezvous, first step) means a hang: all ranks get SIGUSR1 (faulthandler dumps every thread's Python stack to
``ranks/rank<R>.stacks``), then all are killed. A rank that exits non-zero means a crash: the others are
killed at once (they would otherwise wait forever in their next collective). Cancellation
(``threading.Event``), Ctrl-C and the overall timeout kill everything too.

No orphan: each rank runs in its own session (its own process group), killed with ``killpg``; and each rank
watches the launcher's pid and exits if the launcher disappears (even after a SIGKILL of the launcher).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_overlap.verify.judge.attribution import (
    RankEnd,
    describe,
    error_of,
    first_failure,
    is_peer_error,
    proc_state,
    signal_name,
)
from moe_overlap.verify.run.ranks import free_port  # two verifications at once get different ports
from moe_overlap.verify.run.records import RecordTail, output_path, rank_dir, records_path, stacks_path
from moe_overlap.verify.run.worker import PARENT_ENV

POLL_S = 0.1
STACK_DUMP_WAIT_S = 1.0
SETTLE_S = 0.5  # after a first failure: let the others' ends be seen too before attributing it
_PKG_PARENT = str(Path(__file__).resolve().parents[2])


@dataclass
class LaunchResult:
    status: str  # completed | crashed | hang | timeout | cancelled
    message: str = ""
    failed_rank: int | None = None
    traceback: str | None = None
    stacks: dict[str, str] = field(default_factory=dict)
    records: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    returncodes: dict[int, int | None] = field(default_factory=dict)
    pids: list[int] = field(default_factory=list)
    elapsed_s: float = 0.0
    ranks: list[dict[str, Any]] = field(default_factory=list)  # how each rank ended (attribution.RankEnd)


def worker_command(*, config_path: Path, modes_arg: str, out: Path, device: str,
                   inject_fault: str | None = None, extra_args: list[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "moe_overlap.verify.run.worker", "--config", str(config_path), "--modes", modes_arg,
           "--out", str(out), "--device", device, *extra_args]
    return cmd + (["--inject-fault", inject_fault] if inject_fault else [])


def _rank_env(rank: int, world: int, port: int, threads: int, extra_env: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra_env or {})  # e.g. an NCCL fabric (ep/fabric.py): read when the communicator is created
    env.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS=str(threads),
               MOE_OVERLAP_THREADS=str(threads), PYTHONUNBUFFERED="1", PYTHONFAULTHANDLER="1")
    env[PARENT_ENV] = str(os.getpid())
    # Runs from a checkout without installation too: the package's parent goes first on the path.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PKG_PARENT, env.get("PYTHONPATH", "")) if p)
    return env


# Every rank process group this process has started and not yet reaped: what kill_every_rank() ends at once
# when the process itself must stop now (the MCP server on SIGTERM or when its client is gone).
_LIVE: set[int] = set()
_LIVE_LOCK = threading.Lock()


def kill_every_rank() -> None:
    """SIGKILL every rank process group still alive (safe from a signal handler or another thread)."""
    with _LIVE_LOCK:
        pgids = list(_LIVE)
    for pgid in pgids:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _kill_all(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            pass


def _dump_stacks(procs: list[subprocess.Popen], out: Path) -> dict[str, str]:
    alive = [(r, p) for r, p in enumerate(procs) if p.poll() is None]
    for _, p in alive:
        try:
            os.kill(p.pid, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    time.sleep(STACK_DUMP_WAIT_S)
    stacks = {}
    for r, _ in alive:
        text = stacks_path(out, r).read_text(encoding="utf-8", errors="replace") if stacks_path(out, r).exists() else ""
        stacks[str(r)] = text or "(no stack dump: the rank was not yet in Python, or did not answer SIGUSR1)"
    return stacks


def _ends(procs: list[subprocess.Popen], codes: list[int | None], seen: dict[int, float],
          records: dict[int, list[dict[str, Any]]]) -> list[RankEnd]:
    """Every rank's end as it stood before the launcher killed anything (attribution.py)."""
    ends = []
    for r, p in enumerate(procs):
        code = codes[r]
        error_at, tb = error_of(records.get(r, []))
        last = records.get(r, [])[-1] if records.get(r) else None
        end = RankEnd(rank=r, pid=p.pid, state="running", exit_code=code, seen_at=seen.get(r), error_at=error_at,
                      peer_error=is_peer_error(tb),
                      last_record=(f"{last.get('kind')} mode={last.get('mode')} step={last.get('step')}"[:200]
                                   if last else None))
        if code is None:
            end.state = "stopped" if proc_state(p.pid) in ("T", "t") else "running"
        elif code < 0:
            end.state, end.signal = "killed", signal_name(code)
        else:
            end.state = "exited"
        ends.append(end)
    return ends


def _crash(procs, codes, seen, records, out: Path) -> LaunchResult:
    ends = _ends(procs, codes, seen, records)
    first = first_failure(ends)
    rank = first.rank if first is not None else 0
    _, tb = error_of(records.get(rank, []))
    message = describe(first) if first is not None else f"rank {rank} failed"
    return LaunchResult(status="crashed", failed_rank=rank, message=message,
                        traceback=tb or _tail_text(output_path(out, rank)) or None,
                        ranks=[e.to_dict() for e in ends])


def _settle(procs, tails, records, seen) -> list[int | None]:
    """Keep watching for SETTLE_S after the first failure, so that ranks failing at about the same time are all
    seen (and classified) before anything is killed; returns the exit codes as they then stand."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        for r, tail in tails.items():
            records[r].extend(tail.poll())
        codes = [p.poll() for p in procs]
        for r, c in enumerate(codes):
            if c is not None and r not in seen:
                seen[r] = time.time()
        if time.monotonic() >= deadline or all(c is not None for c in codes):
            return codes
        time.sleep(0.05)


def _hang(procs, codes, seen, records, tails, silent, hang_timeout_s, out) -> LaunchResult:
    """A rank went silent: a stopped one (state T) is the cause; else the one silent the longest."""
    ends = _ends(procs, codes, seen, records)
    stopped = [e for e in ends if e.state == "stopped"]
    if stopped:
        r = stopped[0].rank
        message = describe(stopped[0])
    else:
        r = min(silent, key=lambda i: tails[i].last_seen)
        last = records[r][-1] if records[r] else {}
        where = f" (last record: {last.get('kind')} mode={last.get('mode')} step={last.get('step')})" if last else ""
        message = f"rank {r} sent no heartbeat for {hang_timeout_s:g} s{where}"
    return LaunchResult(status="hang", failed_rank=r, message=message, stacks=_dump_stacks(procs, out),
                        ranks=[e.to_dict() for e in ends])


def _tail_text(path: Path, limit: int = 6000) -> str:
    """The end of a rank's output (it may be large: only the tail is read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 4 * limit))
            data = f.read()
    except OSError:
        return ""
    return data.decode("utf-8", errors="replace")[-limit:]


def launch(*, nproc: int, device: str, config_path: Path, modes_arg: str, out: Path, timeout_s: float,
           hang_timeout_s: float, startup_timeout_s: float = 180.0, inject_fault: str | None = None,
           threads: int = 1, extra_args: list[str] = (), extra_env: dict[str, str] | None = None,
           on_record: Callable[[int, dict[str, Any]], None] | None = None,
           cancel: threading.Event | None = None) -> LaunchResult:
    """Run all ranks to completion or failure; always returns with every rank dead."""
    out = Path(out)
    rank_dir(out).mkdir(parents=True, exist_ok=True)
    port = free_port()
    cmd = worker_command(config_path=config_path, modes_arg=modes_arg, out=out, device=device,
                         inject_fault=inject_fault, extra_args=list(extra_args))
    procs: list[subprocess.Popen] = []
    files = []
    tails = {r: RecordTail(records_path(out, r)) for r in range(nproc)}
    records: dict[int, list[dict[str, Any]]] = {r: [] for r in range(nproc)}
    started = dict.fromkeys(range(nproc), False)  # the rank finished its first step
    # Start-up (importing torch, rendezvous, building the models, the first step's lazy imports) can take
    # longer than a tight hang timeout on a loaded machine: it gets its own limit, which still catches a
    # rendezvous that never completes.
    startup_limit = max(hang_timeout_s, startup_timeout_s)
    t0 = time.monotonic()
    result = LaunchResult(status="completed")
    try:
        for r in range(nproc):
            # "x": a new file or an error, never an earlier run's file or a link planted in its place.
            f = open(output_path(out, r), "xb")  # noqa: SIM115 - closed in finally
            files.append(f)
            procs.append(subprocess.Popen(cmd, env=_rank_env(r, nproc, port, threads, extra_env), stdin=subprocess.DEVNULL,
                                          stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
            with _LIVE_LOCK:
                _LIVE.add(procs[-1].pid)  # its own session: the pid is the process group id
        result.pids = [p.pid for p in procs]
        for t in tails.values():
            t.last_seen = time.monotonic()  # the clock starts at spawn, not at the first record
        seen: dict[int, float] = {}  # rank -> time.time() its exit was first seen
        while True:
            for r, tail in tails.items():
                for rec in tail.poll():
                    records[r].append(rec)
                    started[r] = started[r] or rec.get("kind") == "step"
                    if on_record is not None:
                        on_record(r, rec)
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            for r, c in enumerate(codes):
                if c is not None and r not in seen:
                    seen[r] = time.time()
            errored = any(recs and recs[-1].get("kind") == "error" for recs in records.values())
            if errored or any(c not in (None, 0) for c in codes):
                codes = _settle(procs, tails, records, seen)
                result = _crash(procs, codes, seen, records, out)
                break
            if all(c == 0 for c in codes):
                break
            if cancel is not None and cancel.is_set():
                result = LaunchResult(status="cancelled", message="cancelled by the caller")
                break
            if now - t0 > timeout_s:
                result = LaunchResult(status="timeout", message=f"the run exceeded --timeout {timeout_s:g} s",
                                      stacks=_dump_stacks(procs, out))
                break
            silent = [r for r, p in enumerate(procs) if codes[r] is None
                      and now - tails[r].last_seen > (hang_timeout_s if started[r] else startup_limit)]
            if silent:
                result = _hang(procs, codes, seen, records, tails, silent, hang_timeout_s, out)
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        result = LaunchResult(status="cancelled", message="interrupted (Ctrl-C)")
    finally:
        _kill_all(procs)
        with _LIVE_LOCK:
            _LIVE.difference_update(p.pid for p in procs)
        for f in files:
            f.close()
    for r, tail in tails.items():
        records[r].extend(tail.poll())
    if not result.ranks:
        result.ranks = [e.to_dict() for e in _ends(procs, [p.returncode for p in procs], {}, records)]
    result.records = records
    result.returncodes = {r: p.returncode for r, p in enumerate(procs)}
    result.pids = [p.pid for p in procs]
    result.elapsed_s = time.monotonic() - t0
    return result
