"""Synchronous tool work (parsing, validating, estimating, reading a file) off the event loop, within a time budget.

Why: the event loop answers every client (tools/list, ping, other sessions over HTTP); one call's CPU work must
not stall it, and a client that gives up on calls must not make the server run them all at once. So at most
WORKERS calls compute at a time, each in a worker thread that holds its slot until its work is really done (an
abandoned call keeps its slot until it ends: a storm of abandoned calls queues, it does not pile up threads that
all fight for the interpreter), and a call that runs past its budget is answered with an error at once. Every
parser is bounded (docs/limits.md), so a slot is never held for long.
Torch-free.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import anyio
from mcp.server.mcpserver.exceptions import ToolError

T = TypeVar("T")
BUDGET_S = 30.0  # far above any bounded call (the slowest measured: well under a second; benchmarks/fuzz/fuzz.py)
WORKERS = 2  # CPU-bound Python: more threads only share the interpreter lock with the event loop
_slots = threading.BoundedSemaphore(WORKERS)


async def bounded(fn: Callable[..., T], *args: Any, what: str, budget_s: float = BUDGET_S) -> T:
    """`fn(*args)` in a worker thread once a slot is free; a ToolError naming `what` past `budget_s`."""
    state = {"phase": "waiting"}
    lock = threading.Lock()

    def run() -> T:
        with lock:
            if state["phase"] == "dropped":  # the call was given up before this thread started
                return None  # type: ignore[return-value]
            state["phase"] = "running"
        try:
            return fn(*args)
        finally:
            _slots.release()

    try:
        with anyio.fail_after(budget_s):
            while not _slots.acquire(blocking=False):
                await anyio.sleep(0.01)
            state["phase"] = "queued"
            return await anyio.to_thread.run_sync(run, abandon_on_cancel=True)
    except TimeoutError:
        raise ToolError(f"`{what}` took longer than {budget_s:g} s and was abandoned. Fix: send a smaller input "
                        "(a shorter log excerpt, a smaller config).") from None
    finally:
        with lock:
            if state["phase"] == "queued":  # the slot was taken but the thread never started: give it back
                state["phase"] = "dropped"
                _slots.release()
