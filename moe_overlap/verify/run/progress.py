"""How far a verification run is: its events as one count that only grows, from start-up to the verdict.

The unit of work is one optimizer step of one mode; the modes run interleaved, step by step (every mode's
step 1, then every mode's step 2, ...), so a run of S steps and M modes has S x M of them. Start-up
(planning, the ranks starting, torch and the process group coming up, one model built per mode) and
judging count as units too, so progress moves from the first second to the verdict:

    total = 3 (plan, ranks, process group) + M (models) + S x M (steps) + 1 (judging) + 1 (verdict)

On GPUs a run whose throughput is not settled after S steps steps on (up to --max-steps): each extra step
of every mode adds M to the total, which only grows.

Between events, `tick` moves the count a little within the current unit (never reaching the next one),
saying what the run is doing, so a client sees it alive during the seconds torch takes to import or the
judge to read the logs.
Torch-free; used by the MCP server (notifications/progress) and the CLI (its progress lines).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Literal

from pydantic import BaseModel, Field

Phase = Literal["start-up", "training", "judging", "done"]
START_UNITS = 3  # planned, ranks started, process group up
# Within a unit, `tick` approaches (never reaches) the next one with this time constant, seconds.
TICK_TAU_S = {"start-up": 3.0, "training": 2.0, "judging": 2.0, "done": 1.0}
TICK_SHARE = 0.9  # at most this much of a unit is filled by ticks
TICK_STEP = 0.01  # smaller moves are not reported
TICK_AFTER_S = 1.0  # ticks start when no event came for this long ...
TICK_EVERY_S = 1.0  # ... and come at most this often


def record_event(rec: dict[str, Any], *, nproc: int, max_steps: int) -> dict[str, Any] | None:
    """The progress event (verify.api's callback) that one of rank 0's records stands for, if any: the same
    for the local launcher and for a batch job whose records are read from the shared folder."""
    kind = rec.get("kind")
    if kind == "hello":
        return {"event": "ranks", "nproc": nproc}
    if kind == "init":
        return {"event": "init", "backend": rec.get("backend")}
    if kind == "mode_start":
        return {"event": "mode", "mode": rec.get("mode"), "schedule": rec.get("schedule")}
    if kind == "step" and isinstance(rec.get("step"), int):
        return {"event": "step", "mode": rec.get("mode"), "step": rec["step"] + 1, "steps": max_steps,
                "loss": rec.get("loss")}
    return None


class RunProgress(BaseModel):
    done: float = Field(description="units finished (one unit: one step of one mode; start-up and judging "
                                    "count too)")
    total: float = Field(description="units of the whole run")
    phase: Phase
    message: str


class ProgressTracker:
    """Feed it run events (verify.api's progress callback); read `current`, monotone by construction."""

    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.modes: list[str] = []
        self.steps = 0
        self.max_steps = 0
        self.current: RunProgress | None = None
        self._base = 0.0  # the whole units done at the last event
        self._since = clock()
        self._pending = ""
        self._ticked = clock()
        self._lock = threading.Lock()  # fed from the run's thread, ticked from the server's loop
        self.history: list[RunProgress] = []  # every value, in order: a poller sends the ones it missed

    @property
    def total(self) -> float:
        return float(START_UNITS + len(self.modes) * (1 + self.steps) + 2)

    def feed(self, event: dict[str, Any]) -> RunProgress | None:
        """The new progress after `event`, or None when it does not move the count forward."""
        with self._lock:
            return self._feed(event)

    def _feed(self, event: dict[str, Any]) -> RunProgress | None:
        kind = event.get("event")
        m = len(self.modes)
        if kind == "start":
            self.modes = list(event.get("modes") or [])
            self.steps = int(event.get("steps") or 0)
            self.max_steps = int(event.get("max_steps") or self.steps)
            return self._set(1, "start-up", f"planned: {len(self.modes)} mode(s) x {self.steps} step(s) on "
                                            f"{event.get('nproc')} rank(s)", "starting the ranks")
        if kind == "ranks":
            return self._set(2, "start-up", "ranks started", "importing torch, joining the process group")
        if kind == "init":
            return self._set(3, "start-up", f"process group up ({event.get('backend', '?')})",
                             f"building the model of mode {self.modes[0] if self.modes else '?'}")
        if kind == "mode":
            i = self._index(event.get("mode"))
            pending = (f"building the model of mode {self.modes[i + 1]}" if i + 1 < m
                       else f"step 1 of mode {self.modes[0] if self.modes else '?'}")
            return self._set(START_UNITS + i + 1, "start-up", f"model built for mode {event.get('mode')}", pending)
        if kind == "step":
            i, s = self._index(event.get("mode")), int(event.get("step") or 0)
            loss = event.get("loss")
            if s > self.steps:  # stepping on past the plan (cuda, throughput not settled): the total grows
                self.steps = s
                text = f"extra step {s} (at most {self.max_steps}) of mode {event.get('mode')}"
            else:
                text = f"step {s}/{self.steps} of mode {event.get('mode')}"
            text += f", loss {loss:.4f}" if isinstance(loss, float) else ""
            if i + 1 < m or s < self.steps:
                nxt_mode, nxt_step = (self.modes[i + 1], s) if i + 1 < m else (self.modes[0], s + 1)
                pending = f"step {nxt_step} of mode {nxt_mode}"
            else:
                pending = "the ranks finishing (logs, timings, exit)"
            return self._set(START_UNITS + m + (s - 1) * m + i + 1, "training", text, pending)
        if kind == "slurm":  # the batch job's state (slurm_run.py): said within the current unit
            why = f" ({event['reason']})" if event.get("reason") not in (None, "None") else ""
            self._pending = f"Slurm job {event.get('job_id')}: {event.get('state')}{why}"
            if self.current is None:
                return None
            done = round(min(self.current.done + TICK_STEP, self._base + TICK_SHARE), 2)
            if done <= self.current.done:
                return None
            self.current = RunProgress(done=done, total=self.total, phase=self.current.phase, message=self._pending)
            self.history.append(self.current)
            return self.current
        if kind == "judge":
            return self._set(self.total - 1, "judging", "training done; judging: losses, throughput, logs",
                             "judging: losses, throughput, logs")
        if kind == "done":
            return self._set(self.total, "done", f"verdict: {event.get('verdict')}", "")
        return None

    def tick(self) -> RunProgress | None:
        """A small move within the current unit when no event came for a while (None: nothing to report)."""
        with self._lock:
            return self._tick()

    def _tick(self) -> RunProgress | None:
        if self.current is None or self.current.phase == "done":
            return None
        now = self.clock()
        waited = now - self._since
        if waited < TICK_AFTER_S or now - self._ticked < TICK_EVERY_S:
            return None
        share = TICK_SHARE * (1 - math.exp(-waited / TICK_TAU_S[self.current.phase]))
        done = round(self._base + share, 2)
        if done < self.current.done + TICK_STEP:
            return None
        self._ticked = now
        self.current = RunProgress(done=done, total=self.total, phase=self.current.phase,
                                   message=f"{self._pending} ({waited:.0f} s)")
        self.history.append(self.current)
        return self.current

    def since(self, done: float) -> list[RunProgress]:
        """Every value after `done` (what a poller that last sent `done` has not sent yet), in order."""
        with self._lock:
            return [p for p in self.history if p.done > done]

    def _index(self, mode: Any) -> int:
        return self.modes.index(mode) if mode in self.modes else 0

    def _set(self, done: float, phase: Phase, message: str, pending: str) -> RunProgress | None:
        """A finished unit: `message` says what was done, `pending` what the run does until the next one."""
        if self.current is not None and done <= self.current.done:
            return None  # a repeated or late event (e.g. a restarted launch): never go back
        self._base, self._since, self._pending = float(done), self.clock(), pending
        self.current = RunProgress(done=float(done), total=self.total, phase=phase, message=message)
        self.history.append(self.current)
        return self.current
