"""Run one function on N spawned ranks and collect what each returns (for calibration and benchmarks).

Torch is imported only in the children (``spawn`` start method), so the caller (CLI, MCP server) stays
torch-free. The rendezvous is a TCP store on a port the OS just handed out. A rank that raises sends its
traceback back; on timeout every child is killed by its own pid.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
import socket
import time
import traceback
from collections.abc import Callable
from typing import Any


class RanksFailed(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn: Callable, rank: int, world: int, port: int, backend: str, threads: int, args: tuple,
           out: Any) -> None:
    try:
        import torch
        import torch.distributed as dist

        # The 2 CPU cores are shared: one intra-op thread per rank keeps ranks from fighting each other.
        torch.set_num_threads(threads)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group(backend, rank=rank, world_size=world)
        try:
            result = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        out.put((rank, True, result))
    except BaseException:  # noqa: BLE001 - the parent needs every failure as text
        out.put((rank, False, traceback.format_exc()))


def run_ranks(fn: Callable, *args: Any, world: int = 2, backend: str = "gloo", threads: int = 1,
              timeout_s: float = 600.0) -> list[Any]:
    """``fn(rank, world, *args)`` on ``world`` ranks; returns the results in rank order."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world, port, backend, threads, args, out), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RanksFailed(f"ranks did not finish within {timeout_s:.0f} s")
            try:
                rank, ok, value = out.get(timeout=min(left, 1.0))
            except queue_mod.Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RanksFailed(f"a rank exited with code {dead[0].exitcode}") from None
                continue
            if not ok:
                raise RanksFailed(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    return [results[r] for r in range(world)]
