"""Run one function on N ranks (child processes) and collect what each returns; a hang fails instead of blocking.

The one rank launcher of the repository: calibration, the benchmarks and the distributed tests
(``tests/distributed/_spawn.py``) all call ``spawn_ranks``. Torch is imported only in the children, so a
caller that uses the ``spawn`` start method (CLI, MCP server) stays torch-free. The rendezvous is a TCP
store on a port the OS just handed out. A rank that raises sends its traceback back and the others get
10 s more to report (one failure usually leaves the rest blocked in a collective); a rank still running
at the deadline is killed by its own pid.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


class RankError(RuntimeError):
    """A rank raised or died without a result; the message holds every failing rank's traceback."""


class RankTimeout(RankError):
    """A rank did not finish before the deadline (a hang)."""


RanksFailed = RankError  # the name calibration uses


def free_port() -> int:
    """A port the OS just handed out (the rendezvous of the ranks, and of verification runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable, rank: int, world: int, port: int, args: tuple, results: Any, timeout: float,
           backend: str, threads: int, pass_group: bool) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sent = False
    try:
        import datetime

        import torch
        import torch.distributed as dist

        # The CPU cores are shared: one intra-op thread per rank keeps ranks from fighting each other.
        torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
        try:
            out = fn(rank, world, dist.group.WORLD, *args) if pass_group else fn(rank, world, *args)
            # Plain pickle copies tensor bytes; the queue's own pickler would share them by file
            # descriptor, which breaks once this process has exited.
            results.put((rank, True, pickle.dumps(out)))
            sent = True
            # Rank 0's process hosts the TCP store: leaving before the other ranks are done with it
            # (a late new_group rendezvous, say) breaks their pipe. A rank that never arrives here
            # is reported by the parent, which then kills the ranks left waiting.
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent needs every failure as text
        if not sent:
            results.put((rank, False, traceback.format_exc()))


def spawn_ranks(fn: Callable, world: int, args: tuple = (), *, backend: str = "gloo", threads: int = 1,
                timeout: float = 600.0, start_method: str = "spawn", pass_group: bool = False) -> list[Any]:
    """``fn(rank, world, *args)`` (``fn(rank, world, group, *args)`` with ``pass_group``) on ``world``
    ranks; the results in rank order. ``fn`` must be importable at module level. Raises ``RankError``
    (every failing rank's traceback) or ``RankTimeout``."""
    ctx = mp.get_context(start_method)
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, daemon=True,
                         args=(fn, r, world, port, args, results, timeout, backend, threads, pass_group))
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    got: dict[int, tuple[bool, Any]] = {}
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(got))
                raise RankTimeout(f"ranks {missing} did not finish within {timeout:.0f} s (hang?)" + _failures(got))
            try:
                rank, ok, out = results.get(timeout=min(left, 1.0))
                got[rank] = (ok, out)
                if not ok:  # one failure usually leaves the other ranks blocked in a collective
                    deadline = min(deadline, time.monotonic() + 10)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and results.empty():
                    missing = sorted(set(range(world)) - set(got))
                    raise RankError(f"ranks {missing} exited without a result" + _failures(got)) from None
    finally:
        # Every rank has reported (or we gave up): give the finished ones a moment to exit, then kill
        # any that is still there (a hung rank) by its own pid.
        grace = time.monotonic() + (5 if len(got) == world else 0.5)
        for p in procs:
            p.join(timeout=max(0.0, grace - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    failures = _failures(got)
    if failures:
        raise RankError(failures)
    return [pickle.loads(got[r][1]) for r in range(world)]


def _failures(got: dict[int, tuple[bool, Any]]) -> str:
    return "".join(f"\n--- rank {r} ---\n{out}" for r, (ok, out) in sorted(got.items()) if not ok)


def run_ranks(fn: Callable, *args: Any, world: int = 2, backend: str = "gloo", threads: int = 1,
              timeout_s: float = 600.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` spawned ranks (the caller stays torch-free)."""
    return spawn_ranks(fn, world, args, backend=backend, threads=threads, timeout=timeout_s)
