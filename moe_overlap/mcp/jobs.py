"""Verification jobs: one thread each, a cancel Event, a handle the client polls.

Why threads and handles: a verification takes tens of seconds to minutes, longer than many clients'
60 s tool timeout, and the SDK has no tasks. `run_verification(background=true)` returns a handle at
once; `get_verification_status` polls it; `cancel_verification` sets the Event and waits until the
run (and the rank processes it launched) are gone. `shutdown()` cancels every job: the server calls
it when the client goes away (stdin closed, lifespan end) so no rank process outlives the session.

Jobs belong to whoever started them (`owner`): None for the one client of a stdio server, ``session:<id>`` for an
HTTP session (Mcp-Session-Id), ANONYMOUS for sessionless HTTP requests (protocol 2026-07-28), where the id alone is
the handle and is therefore never named to anyone but in the answer that created it. Another owner's job is "no
such job" to every call, and no message names a job that is not the caller's. Ids are 128 random bits, so a handle
cannot be guessed.
Torch-free.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

logger = logging.getLogger(__name__)
JobState = Literal["running", "succeeded", "failed", "cancelled"]
ANONYMOUS = "http-without-session"
RunFn = Callable[[Callable[[dict[str, Any]], None], threading.Event], BaseModel]


class JobError(Exception):
    """A job request the client can fix (unknown id, too many running)."""


@dataclass
class Job:
    id: str
    description: str
    started_at: float
    owner: str | None = None
    cancel_event: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    state: JobState = "running"
    progress: dict[str, Any] = field(default_factory=dict)
    progress_count: int = 0
    first_progress: dict[str, Any] = field(default_factory=dict)
    recent: collections.deque = field(default_factory=lambda: collections.deque(maxlen=10))
    result: BaseModel | None = None
    error: str | None = None
    ended_at: float | None = None
    thread: threading.Thread | None = None
    view: Any = None  # what the tool layer keeps beside the run (its progress tracker)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_progress(self, event: dict[str, Any]) -> None:
        # Called from the job thread; readers take a copy under the lock.
        with self._lock:
            if not self.progress_count:
                self.first_progress = dict(event)
            self.progress = dict(event)
            self.progress_count += 1
            self.recent.append(dict(event))

    def snapshot(self) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
        with self._lock:
            return dict(self.progress), self.progress_count, list(self.recent)

    def elapsed_s(self) -> float:
        return round((self.ended_at or time.time()) - self.started_at, 3)

    def join(self, timeout: float | None) -> bool:
        return self.finished.wait(timeout)


class JobManager:
    """Jobs of one server. At most `max_running` at a time (each run spawns several rank processes)."""

    def __init__(self, *, max_running: int = 1, keep_finished: int = 20):
        self.max_running = max_running
        self.keep_finished = keep_finished
        self._jobs: dict[str, Job] = {}
        self._lock = threading.RLock()  # re-entrant: shutdown() may run in a signal handler on a thread holding it
        self.closing = threading.Event()  # set by shutdown(): waits become short, new runs are refused

    def running(self) -> list[Job]:
        with self._lock:
            return [j for j in self._jobs.values() if not j.finished.is_set()]

    def start(self, run: RunFn, *, description: str, owner: str | None = None) -> Job:
        with self._lock:
            if self.closing.is_set():
                raise JobError("the server is shutting down")
            if self.max_running < 1:
                raise JobError("this server runs no verification (started with --max-jobs 0); the input was checked "
                               "and is valid")
            busy = [j for j in self._jobs.values() if not j.finished.is_set()]
            if len(busy) >= self.max_running:
                mine = [j.id for j in busy if j.owner == owner and owner != ANONYMOUS]
                if mine:
                    raise JobError(f"your verification {', '.join(mine)} is still running; wait for it with "
                                   "get_verification_status or stop it with cancel_verification")
                raise JobError(f"this server runs {self.max_running} verification(s) at a time and one is running "
                               "(not started from this session); try again when it has finished")
            job = Job(id=f"verify-{secrets.token_hex(16)}", description=description, started_at=time.time(),
                      owner=owner)
            self._jobs[job.id] = job
            self._forget_old()
        thread = threading.Thread(target=self._run, args=(job, run), name="verify-job", daemon=True)
        job.thread = thread
        thread.start()
        return job

    def _run(self, job: Job, run: RunFn) -> None:
        try:
            job.result = run(job.on_progress, job.cancel_event)
            job.state = "cancelled" if job.cancel_event.is_set() else "succeeded"
        except BaseException as exc:  # the thread must always end in a final state
            message = getattr(exc, "message", None)  # an input error of the run (VerifyInputError): its own words
            if not isinstance(message, str):
                logger.exception("verification job crashed")
                message = "the run stopped on an unexpected error in the server; its log (stderr) has the details"
            job.error = message
            job.state = "cancelled" if job.cancel_event.is_set() else "failed"
        finally:
            job.ended_at = time.time()
            job.finished.set()

    def _forget_old(self) -> None:
        done = [j for j in self._jobs.values() if j.finished.is_set()]
        for j in done[: max(0, len(done) - self.keep_finished)]:
            del self._jobs[j.id]

    def get(self, job_id: str, owner: str | None = None) -> Job:
        """The caller's job, or JobError. Another owner's job is reported exactly like a missing one."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None and job.owner != owner:
                job = None
            mine = [j.id for j in self._jobs.values() if j.owner == owner and owner != ANONYMOUS]
        if job is None:
            known = f"; your jobs: {', '.join(mine)}" if mine else ""
            # The id given is not repeated: a job that is someone else's must look exactly like one that never was.
            raise JobError(f"no verification job with this id in this session{known}")
        return job

    def cancel(self, job_id: str, *, wait_s: float, owner: str | None = None) -> Job:
        job = self.get(job_id, owner)
        job.cancel_event.set()
        job.join(wait_s)
        return job

    def shutdown(self, *, wait_s: float = 30.0) -> None:
        """Cancel every running job, kill the rank processes now, and wait (bounded) for the jobs to end."""
        self.closing.set()
        jobs = self.running()
        for job in jobs:
            job.cancel_event.set()
        kill_ranks_now()
        deadline = time.monotonic() + wait_s
        for job in jobs:
            job.join(max(0.0, deadline - time.monotonic()))


def kill_ranks_now() -> None:
    """Every rank process a verification of this process started, killed at once, and every Slurm job it
    submitted scancelled (no report is waited for).
    Nothing to do when no verification ever ran (the launcher module was never imported)."""
    launcher = sys.modules.get("moe_overlap.verify.run.launcher")
    if launcher is not None:
        launcher.kill_every_rank()
    slurm = sys.modules.get("moe_overlap.verify.run.slurm_job")
    if slurm is not None:  # batch jobs (launcher slurm) run under slurmd, not under us: scancel them
        slurm.cancel_every_job()


def descendant_pids(pid: int | None = None) -> list[int]:
    """Live descendants of `pid` (default: this process), read from /proc; [] where /proc is absent.

    Zombies are left out: an exited child that its parent has not reaped yet runs nothing.
    """
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as fh:
                stat = fh.read()
        except OSError:
            continue  # exited while we looked
        # comm may hold spaces or parentheses: the fields after the last ')' are fixed.
        rest = stat[stat.rfind(")") + 2:].split()
        state, ppid = rest[0], int(rest[1])
        if state != "Z":
            children.setdefault(ppid, []).append(int(name))
    out, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return sorted(out)
