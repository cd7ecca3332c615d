"""Start N gloo ranks on CPU, run one function in each, collect results; a hang fails instead of blocking.

Usage (the function must be importable at module level, e.g. defined in the test module):

    def body(rank, world, group, *args):  # runs in each child, torch.set_num_threads(1) already done
        ...
        return something_picklable         # tensors are fine (moved to CPU first)

    results = run_ranks(body, world=2, args=(...), timeout=90)   # list indexed by rank

A child that raises makes ``run_ranks`` raise ``RankError`` with every failing rank's traceback;
a child still running at ``timeout`` seconds is killed (by its own pid) and ``RankTimeout`` is raised.
The rendezvous uses a free TCP port on 127.0.0.1, retried once if another process grabbed it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import socket
import sys
import time
import traceback


class RankError(RuntimeError):
    pass


class RankTimeout(RankError):
    pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn, rank, world, port, args, results, timeout, backend):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sent = False
    try:
        import datetime

        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=timeout),
        )
        try:
            out = fn(rank, world, dist.group.WORLD, *args)
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
    except BaseException:  # noqa: BLE001 - everything goes back to the parent
        if not sent:
            results.put((rank, False, traceback.format_exc()))


def run_ranks(fn, world: int, args: tuple = (), timeout: float = 120.0, start_method: str | None = None,
              backend: str = "gloo") -> list:
    """Run ``fn(rank, world, group, *args)`` in ``world`` child processes; return results by rank.

    ``start_method`` defaults to "fork" on Linux: a forked child inherits the already imported torch
    (re-importing it costs seconds per rank on a loaded machine), as DataLoader workers do;
    "spawn" elsewhere, for ``backend="nccl"`` (rank r uses cuda:r; CUDA does not survive a fork),
    or when asked (env ``MOE_SPAWN_METHOD``).
    """
    default = "fork" if sys.platform.startswith("linux") and backend == "gloo" else "spawn"
    ctx = mp.get_context(start_method or os.environ.get("MOE_SPAWN_METHOD", default))
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, args, results, timeout, backend), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout
    got: dict[int, tuple[bool, object]] = {}
    try:
        while len(got) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(world)) - set(got))
                raise RankTimeout(f"ranks {missing} did not finish within {timeout:.0f} s (hang?)"
                                  + _failures(got))
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


def _failures(got) -> str:
    return "".join(f"\n--- rank {r} ---\n{out}" for r, (ok, out) in sorted(got.items()) if not ok)
