"""run_verification, get_verification_status, cancel_verification: verification runs behind job handles.

The run itself is `moe_overlap.verify.api.run_verification` in a job thread (jobs.py); it launches only
our own worker module with validated options, never a client-given command. Blocking calls poll the
job and forward its progress; if the client cancels the request (or goes away), the job is cancelled
and waited for, so its rank processes end with it. Torch-free: torch runs in the rank processes.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from moe_overlap.mcp import inputs as ins
from moe_overlap.mcp.jobs import ANONYMOUS, Job, JobError, JobManager, descendant_pids
from moe_overlap.mcp.results import VerificationStatus, bounded_report
from moe_overlap.mcp.safety import AllowedRoots
from moe_overlap.mcp.toolkit import ArgumentGuard, add_model_tool, annotations
from moe_overlap.mcp.tools_skill import as_tool_error, config_source
from moe_overlap.mcp.work import bounded

POLL_S = 0.25
CANCEL_WAIT_S = 30.0


class ProgressMapper:
    """Run events -> (progress, total, message) for notifications/progress, never going backwards.

    Steps count across modes: mode i, step s of S is i*S + s out of len(modes)*S. The protocol requires
    progress to grow; the blocking tool polls, so it may see any subset of the events.
    """

    def __init__(self) -> None:
        self.steps: int | None = None
        self.last = -1.0

    def __call__(self, event: dict[str, Any], first: dict[str, Any]) -> tuple[float, float | None, str] | None:
        modes = first.get("modes") or []
        kind, mode = event.get("event"), event.get("mode")
        if isinstance(event.get("steps"), int):
            self.steps = event["steps"]
        total = float(len(modes) * self.steps) if self.steps and modes else None
        index = modes.index(mode) if mode in modes else 0
        if kind == "step" and self.steps:
            done = float(index * self.steps + int(event.get("step", 0)))
            loss = event.get("loss")
            message = f"{mode}: step {event.get('step')}/{self.steps}" + (
                f", loss {loss:.4f}" if isinstance(loss, float) else "")
        elif kind == "mode":
            done, message = float(index * (self.steps or 0)), f"mode {mode} ({event.get('schedule')})"
        elif kind == "done":
            done, message = (total if total is not None else max(self.last, 0.0)), f"done: {event.get('verdict')}"
        else:
            done, message = 0.0, f"starting {len(modes)} mode(s) on {event.get('nproc')} rank(s)"
        if done < self.last:
            return None
        self.last = done
        return done, total, message


def status_of(job: Job, *, with_children: bool = False) -> VerificationStatus:
    progress, _, recent = job.snapshot()
    report, cuts = (bounded_report(job.result) if job.result is not None else (None, []))
    if job.state == "running":
        nxt = (f"call get_verification_status with job_id={job.id!r} and wait_s=30 (it answers when the run ends), "
               "or cancel_verification")
    elif job.state == "succeeded":
        verdict = (report or {}).get("verdict")
        if verdict == "passed":
            nxt = "verdict passed: enable the setting in the real job, then check its log with check_training_log"
        elif verdict == "throughput-not-judged":
            nxt = ("correctness verified, speed not judged (CPU run): to decide on throughput, run on GPUs "
                   "(device='cuda') or read report.analysis for the measured split and the estimate")
        else:
            nxt = f"verdict {verdict}: read report.criteria and report.failure, then diagnose_failure on the message"
    elif job.state == "cancelled":
        nxt = "cancelled; start a new run with run_verification when ready"
    else:
        nxt = "the run could not start or crashed in the server: read `error`, fix the input, run again"
    summary = None
    if job.result is not None:
        from moe_overlap.verify.summary import verification_summary

        summary = verification_summary(job.result).model_dump(mode="json")
    return VerificationStatus(job_id=job.id, state=job.state, elapsed_s=job.elapsed_s(), progress=progress,
                              recent_progress=recent, summary=summary, report=report, error=job.error, truncated=cuts,
                              live_child_processes=descendant_pids() if with_children else None, next_step=nxt)


def owner_of(ctx: Context) -> str | None:
    """Who a job belongs to (jobs.py): None for the one client of stdio (or an in-process client), the HTTP
    session (Mcp-Session-Id) of the request, or ANONYMOUS for sessionless HTTP (protocol 2026-07-28)."""
    try:
        request = ctx.request_context.request
    except (ValueError, AttributeError):
        return None
    headers = getattr(request, "headers", None)
    if headers is None:
        return None
    value = headers.get("mcp-session-id")
    return f"session:{value[:200]}" if isinstance(value, str) and value else ANONYMOUS


async def _wait(job: Job, seconds: float) -> None:
    """Wait for a job in a worker thread that a cancelled request (or a closing server) simply abandons."""
    await anyio.to_thread.run_sync(job.join, seconds, abandon_on_cancel=True)


def register(server: MCPServer, guard: ArgumentGuard, roots: AllowedRoots, jobs: JobManager,
             runs_dir: Path | None) -> None:
    folder: list[Path] = [runs_dir] if runs_dir is not None else []

    def runs_folder() -> Path:
        if not folder:  # created on the first run only: a server that never verifies leaves nothing behind
            folder.append(Path(tempfile.mkdtemp(prefix="moe-overlap-mcp-runs-")))
        return folder[0]

    def options_for(inp: ins.RunVerificationInput) -> Any:
        from moe_overlap.verify.options import VerifyOptions

        source = None
        if any(x is not None for x in (inp.config, inp.config_text, inp.config_path)):
            source = config_source(inp, roots)
        out = runs_folder() / f"run-{uuid.uuid4().hex[:12]}"
        from moe_overlap.verify.plan import VerifyInputError, make_plan

        try:
            options = VerifyOptions(config=source, nproc=inp.nproc, device=inp.device, steps=inp.steps,
                                    micro_batches=inp.micro_batches, modes=inp.modes, schedule=inp.schedule,
                                    timeout_s=inp.timeout_s, out=out)
            make_plan(options)  # input errors surface here, as a ToolError, before any job starts
        except (VerifyInputError, ValueError) as exc:
            raise as_tool_error(exc, "config") from None
        return options

    def start(inp: ins.RunVerificationInput, owner: str | None) -> Job:
        options = options_for(inp)

        def run(progress, cancel):
            from moe_overlap.verify.api import run_verification

            return run_verification(options, progress=progress, cancel=cancel)

        try:
            return jobs.start(run, description=f"verify nproc={inp.nproc} steps={inp.steps} modes={inp.modes}",
                              owner=owner)
        except JobError as exc:
            raise ToolError(f"{exc}.") from None

    async def run_verification(inp: ins.RunVerificationInput, ctx: Context) -> VerificationStatus:
        job = await bounded(start, inp, owner_of(ctx), what="config")  # planning reads files, may probe GPUs
        if inp.background:
            return status_of(job)
        seen, mapper = 0, ProgressMapper()
        try:
            while not job.finished.is_set():
                await anyio.sleep(POLL_S)
                event, count, _ = job.snapshot()
                if count != seen:
                    seen = count
                    update = mapper(event, job.first_progress)
                    if update is not None:
                        await ctx.report_progress(*update)
        finally:
            if not job.finished.is_set():
                # The request was cancelled or the client went away: stop the run and its ranks before
                # returning, shielded so the wait itself is not cancelled. A server that is shutting down has
                # already killed the ranks (JobManager.shutdown) and does not wait for the report.
                job.cancel_event.set()
                if not jobs.closing.is_set():
                    with anyio.CancelScope(shield=True):
                        await _wait(job, CANCEL_WAIT_S)
        return status_of(job)

    def _own_job(job_id: str, ctx: Context) -> Job:
        try:
            return jobs.get(job_id, owner_of(ctx))
        except JobError as exc:
            raise ToolError(f"`job_id`: {exc}. Fix: use the job_id that run_verification returned.") from None

    async def get_verification_status(inp: ins.StatusInput, ctx: Context) -> VerificationStatus:
        job = _own_job(inp.job_id, ctx)
        with anyio.move_on_after(inp.wait_s):
            while not job.finished.is_set():
                await anyio.sleep(POLL_S)
        return status_of(job)

    async def cancel_verification(inp: ins.CancelInput, ctx: Context) -> VerificationStatus:
        job = _own_job(inp.job_id, ctx)
        job.cancel_event.set()
        await _wait(job, inp.wait_s)
        return status_of(job, with_children=True)

    add_model_tool(server, guard, name="run_verification", input_model=ins.RunVerificationInput,
                   result_model=VerificationStatus, handler=run_verification,
                   description="Run A/B verification runs (baseline, overlap, overlap+wgrad) of the included MoE "
                               "implementation on spawned local ranks: loss equality, completion, throughput. "
                               "Blocking with progress, or background=true for a job handle.",
                   # Writes a new report folder each call (not idempotent), deletes nothing, local only.
                   hints=annotations(title="Run a verification", read_only=False, destructive=False,
                                     idempotent=False, open_world=False))
    add_model_tool(server, guard, name="get_verification_status", input_model=ins.StatusInput,
                   result_model=VerificationStatus, handler=get_verification_status,
                   description="State, latest progress and (when finished) the report of a verification job; "
                               "wait_s waits up to that long for it to finish first.",
                   hints=annotations(title="Verification status", read_only=True, destructive=False,
                                     idempotent=True, open_world=False))
    add_model_tool(server, guard, name="cancel_verification", input_model=ins.CancelInput,
                   result_model=VerificationStatus, handler=cancel_verification,
                   description="Cancel a verification job and wait until its rank processes are gone; "
                               "live_child_processes lists any that remain ([] is clean).",
                   # Stops a run (its partial results are lost): destructive; cancelling twice is harmless.
                   hints=annotations(title="Cancel a verification", read_only=False, destructive=True,
                                     idempotent=True, open_world=False))
