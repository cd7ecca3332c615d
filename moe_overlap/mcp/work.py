"""Synchronous tool work (parsing, validating, estimating, reading a file) off the event loop, within a time budget.

Why: the event loop answers every client (tools/list, ping, other sessions over HTTP); one call's CPU work must
not stall it, and a client that gives up on a call must not leave the server short of threads. So the work runs
in a worker thread drawn from a pool of its own (the stdio transport keeps its threads), and a call that runs past
its budget is answered with an error at once; its thread is abandoned and ends on its own: every parser is bounded
(docs/limits.md), so no thread can run on for long.
Torch-free.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

T = TypeVar("T")
BUDGET_S = 30.0  # far above any bounded call (the slowest measured: well under a second; benchmarks/fuzz.py)
WORKERS = 8
_limiter: list[anyio.CapacityLimiter] = []


def _pool() -> anyio.CapacityLimiter:
    if not _limiter:  # created inside the running event loop
        _limiter.append(anyio.CapacityLimiter(WORKERS))
    return _limiter[0]


async def bounded(fn: Callable[..., T], *args: Any, what: str, budget_s: float = BUDGET_S) -> T:
    """`fn(*args)` in a worker thread; a ToolError naming `what` when it takes longer than `budget_s`."""
    try:
        with anyio.fail_after(budget_s):
            return await anyio.to_thread.run_sync(fn, *args, abandon_on_cancel=True, limiter=_pool())
    except TimeoutError:
        raise ToolError(f"`{what}` took longer than {budget_s:g} s and was abandoned. Fix: send a smaller input "
                        "(a shorter log excerpt, a smaller config).") from None
