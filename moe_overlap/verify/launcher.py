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

from moe_overlap.verify.ranks import free_port  # two verifications at once get different ports
from moe_overlap.verify.records import RecordTail, output_path, rank_dir, records_path, stacks_path
from moe_overlap.verify.worker import PARENT_ENV

POLL_S = 0.1
STACK_DUMP_WAIT_S = 1.0
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


def worker_command(*, config_path: Path, modes_arg: str, out: Path, device: str,
                   inject_fault: str | None = None, extra_args: list[str] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "moe_overlap.verify.worker", "--config", str(config_path), "--modes", modes_arg,
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


def _first_crash(procs, tails_records) -> tuple[int, str | None]:
    """The rank that failed first: the earliest `error` record, else the lowest rank that exited non-zero."""
    errors = [(rec["t"], r, rec.get("traceback")) for r, recs in tails_records.items() for rec in recs
              if rec.get("kind") == "error"]
    if errors:
        _, r, tb = min(errors)
        return r, tb
    r = min((r for r, p in enumerate(procs) if p.poll() not in (None, 0)), default=0)
    return r, None


def _tail_text(path: Path, limit: int = 6000) -> str:
    if not path.exists():
        return ""
    data = path.read_text(encoding="utf-8", errors="replace")
    return data[-limit:]


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
            f = open(output_path(out, r), "wb")  # noqa: SIM115 - closed in finally
            files.append(f)
            procs.append(subprocess.Popen(cmd, env=_rank_env(r, nproc, port, threads, extra_env), stdin=subprocess.DEVNULL,
                                          stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
        result.pids = [p.pid for p in procs]
        for t in tails.values():
            t.last_seen = time.monotonic()  # the clock starts at spawn, not at the first record
        while True:
            for r, tail in tails.items():
                for rec in tail.poll():
                    records[r].append(rec)
                    started[r] = started[r] or rec.get("kind") == "step"
                    if on_record is not None:
                        on_record(r, rec)
            codes = [p.poll() for p in procs]
            now = time.monotonic()
            errored = any(recs and recs[-1].get("kind") == "error" for recs in records.values())
            if errored or any(c not in (None, 0) for c in codes):
                for r, tail in tails.items():  # the failing rank's last records (its traceback) first
                    records[r].extend(tail.poll())
                rank, tb = _first_crash(procs, records)
                code = procs[rank].returncode
                how = f"exited with status {code}" if code is not None else "raised an exception"
                result = LaunchResult(status="crashed", failed_rank=rank, message=f"rank {rank} {how}",
                                      traceback=tb or _tail_text(output_path(out, rank)) or None)
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
                r = min(silent, key=lambda i: tails[i].last_seen)  # silent the longest
                last = records[r][-1] if records[r] else {}
                where = f" (last record: {last.get('kind')} mode={last.get('mode')} step={last.get('step')})" if last else ""
                result = LaunchResult(status="hang", failed_rank=r, message=f"rank {r} sent no heartbeat for "
                                      f"{hang_timeout_s:g} s{where}", stacks=_dump_stacks(procs, out))
                break
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        result = LaunchResult(status="cancelled", message="interrupted (Ctrl-C)")
    finally:
        _kill_all(procs)
        for f in files:
            f.close()
    for r, tail in tails.items():
        records[r].extend(tail.poll())
    result.records = records
    result.returncodes = {r: p.returncode for r, p in enumerate(procs)}
    result.pids = [p.pid for p in procs]
    result.elapsed_s = time.monotonic() - t0
    return result
