"""Start N gloo ranks on CPU, run one function in each, collect results; a hang fails instead of blocking.

Usage (the function must be importable at module level, e.g. defined in the test module):

    def body(rank, world, group, *args):  # runs in each child, torch.set_num_threads(1) already done
        ...
        return something_picklable         # tensors are fine (moved to CPU first)

    results = run_ranks(body, world=2, args=(...), timeout=90)   # list indexed by rank

A child that raises makes ``run_ranks`` raise ``RankError`` with every failing rank's traceback;
a child still running at ``timeout`` seconds is killed (by its own pid) and ``RankTimeout`` is raised.
The launcher itself is ``moe_overlap.verify.run.ranks.spawn_ranks`` (shared with calibration).
"""

from __future__ import annotations

import os
import sys

from moe_overlap.verify.run.ranks import RankError, RankTimeout, free_port, spawn_ranks

__all__ = ["RankError", "RankTimeout", "free_port", "run_ranks"]


def run_ranks(fn, world: int, args: tuple = (), timeout: float = 120.0, start_method: str | None = None,
              backend: str = "gloo") -> list:
    """Run ``fn(rank, world, group, *args)`` in ``world`` child processes; return results by rank.

    ``start_method`` defaults to "fork" on Linux: a forked child inherits the already imported torch
    (re-importing it costs seconds per rank on a loaded machine), as DataLoader workers do;
    "spawn" elsewhere, for ``backend="nccl"`` (rank r uses cuda:r; CUDA does not survive a fork),
    or when asked (env ``MOE_SPAWN_METHOD``).
    """
    default = "fork" if sys.platform.startswith("linux") and backend == "gloo" else "spawn"
    return spawn_ranks(fn, world, args, backend=backend, timeout=timeout, pass_group=True,
                       start_method=start_method or os.environ.get("MOE_SPAWN_METHOD", default))
