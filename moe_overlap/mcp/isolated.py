"""Tool work that may hold the interpreter lock for long (regular-expression matching over a large text) in a
worker *process* with a deadline, so the server's event loop and its signal handlers never wait for it.

Why not a thread (work.py): Python's `re` runs a whole search in C without releasing the interpreter lock, so a
thread matching a hostile 60 KB text stops every other thread, the event loop included: no `tools/list` for
other sessions, SIGTERM handled only after the search (issue 34: 60-90 s). In a process the loop is free; a call
past its budget is answered with an error and its process killed (the next call starts a fresh one).
One worker is spawned in the background when a session starts (`prewarm`: a clean interpreter that has
imported the matchers already, so the first call does not pay 1-2 s of start-up), more on demand; each dies with
the server (PR_SET_PDEATHSIG on Linux, and `shutdown()` from the signal handler), and runs one call at a time
(WORKERS of them). Torch-free.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

import anyio
from mcp.server.mcpserver.exceptions import ToolError

BUDGET_S = 10.0  # the whole-text matching is bounded (docs/limits.md); past this the input is hostile
WORKERS = 2
_free: list[_Worker] = []
_all: list[_Worker] = []
_lock = threading.Lock()
_slots = threading.BoundedSemaphore(WORKERS)
# What the tools run here; imported by a pre-warmed worker before its first call.
PRELOAD = ("moe_overlap.skill.diagnose.api", "moe_overlap.skill.diagnose.logs")


def _die_with_parent() -> None:
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: shutdown() still kills the workers on SIGTERM or at exit


def _serve(conn, preload: tuple[str, ...] = ()) -> None:
    _die_with_parent()
    for module in preload:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - the call that needs it raises the same error, where it is reported
            pass
    while True:
        try:
            target, args = conn.recv()
        except (EOFError, OSError):
            return
        module, name = target.split(":")
        try:
            result = ("ok", getattr(importlib.import_module(module), name)(*args))
        except Exception as exc:  # noqa: BLE001 - sent back and raised in the server, as a thread would
            result = ("error", exc)
        try:
            conn.send(result)
        except Exception as exc:  # noqa: BLE001 - an unpicklable result or exception
            conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


class _Worker:
    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_serve, args=(child, preload), daemon=True, name="moe-overlap-mcp-worker")
        self.proc.start()
        child.close()

    def kill(self) -> None:
        try:
            self.proc.kill()
            self.proc.join(1)
        except (OSError, ValueError, AssertionError):
            pass
        self.conn.close()


def _take() -> _Worker:
    with _lock:
        if _free:
            return _free.pop()
    worker = _Worker()
    with _lock:
        _all.append(worker)
    return worker


def prewarm() -> None:
    """Start one worker in a background thread (the caller does not wait); it waits, ready, for the first call."""
    def start() -> None:
        worker = _Worker(PRELOAD)
        with _lock:
            _all.append(worker)
            _free.append(worker)

    threading.Thread(target=start, name="moe-overlap-mcp-prewarm", daemon=True).start()


def _give_back(worker: _Worker) -> None:
    with _lock:
        _free.append(worker)


def _drop(worker: _Worker) -> None:
    worker.kill()
    with _lock:
        if worker in _all:
            _all.remove(worker)


def helper_pids() -> set[int]:
    """The server's own long-lived helpers (these workers and multiprocessing's resource tracker): not a
    verification's processes, so a cancel's report of what is left leaves them out."""
    with _lock:
        pids = {w.proc.pid for w in _all if w.proc.pid is not None}
    try:
        from multiprocessing import resource_tracker

        tracker = getattr(resource_tracker._resource_tracker, "_pid", None)  # noqa: SLF001 - no public accessor
    except (ImportError, AttributeError):
        tracker = None
    return pids | ({tracker} if tracker else set())


def shutdown() -> None:
    """Kill every worker now (SIGTERM, the session's end)."""
    with _lock:
        workers, _all[:], _free[:] = list(_all), [], []
    for w in workers:
        w.kill()


async def isolated(target: str, *args: Any, what: str, budget_s: float = BUDGET_S) -> Any:
    """`module:function`(*args) in a worker process; a ToolError naming `what` past `budget_s` (the worker is
    killed). The function's own exceptions are raised here as they were raised there."""
    with anyio.move_on_after(budget_s) as scope:
        while not _slots.acquire(blocking=False):
            await anyio.sleep(0.01)
    if scope.cancelled_caught:
        raise _too_long(what, budget_s)
    worker = None
    try:
        worker = await anyio.to_thread.run_sync(_take)
        await anyio.to_thread.run_sync(worker.conn.send, (target, args))
        ready = await anyio.to_thread.run_sync(worker.conn.poll, budget_s, abandon_on_cancel=True)
        if not ready:
            _drop(worker)
            worker = None
            raise _too_long(what, budget_s)
        try:
            status, value = worker.conn.recv()
        except (EOFError, OSError):
            _drop(worker)
            worker = None
            raise ToolError(f"`{what}`: the worker process ended while it ran (out of memory?). Fix: send a "
                            "smaller input.") from None
        _give_back(worker)
        worker = None
    except BaseException:
        if worker is not None:  # cancelled (the client gave up): the call may still run there
            _drop(worker)
        raise
    finally:
        _slots.release()
    if status == "error":
        raise value
    return value


def _too_long(what: str, budget_s: float) -> ToolError:
    return ToolError(f"`{what}` took longer than {budget_s:g} s and was abandoned. Fix: send a shorter text (the "
                     "error message and a few lines around it, not the whole log).")
