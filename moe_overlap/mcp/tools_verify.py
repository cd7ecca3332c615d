"""run_verification, get_verification_status, cancel_verification, and each job's report as a resource.

The run itself is `moe_overlap.verify.api.run_verification` in a job thread (jobs.py); it launches only
our own worker module with validated options, never a client-given command. Blocking calls forward
the run's progress (verify.run.progress: start-up, steps x modes, judging); if the client cancels the
request (or goes away), the job is cancelled and waited for, so its rank processes end with it.
A result is the status and the summary; the whole report is `moe-overlap://jobs/<id>/report.json`.
Torch-free: torch runs in the rank processes.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ResourceNotFoundError, ToolError
from mcp.server.mcpserver.tools import Tool

from moe_overlap.jsonout import compact_json
from moe_overlap.mcp.jobs import ANONYMOUS, Job, JobError, JobManager, descendant_pids
from moe_overlap.mcp.safety import AllowedRoots
from moe_overlap.mcp.toolkit import ArgumentGuard, annotations, model_tool
from moe_overlap.mcp.tools_skill import as_tool_error, config_source
from moe_overlap.mcp.wording import flags_as_arguments
from moe_overlap.mcp.work import bounded
from moe_overlap.verify.run.progress import ProgressTracker

if TYPE_CHECKING:  # the input models are imported on a tool's first call (catalog.py)
    from moe_overlap.mcp import inputs as ins

POLL_S = 0.25
CANCEL_WAIT_S = 30.0
MAX_FAILURE_CHARS = 1000  # the failure's message; its traceback is in the report resource
JOB_URI = "moe-overlap://jobs/{job_id}/{file}"



def _job_processes() -> list[int]:
    """What this server still runs for verifications: its descendants less its own diagnose workers (isolated.py)."""
    from moe_overlap.mcp import isolated

    helpers = isolated.helper_pids()
    return [pid for pid in descendant_pids() if pid not in helpers]

def job_uri(job_id: str, file: str = "report.json") -> str:
    return JOB_URI.format(job_id=job_id, file=file)


def next_step(job: Job) -> str:
    cluster = job.result.cluster_job if job.result is not None else None
    if cluster is not None:  # launcher slurm: the batch job, said first (its id is also in the report)
        return (f"Slurm job {cluster.job_id} ended {cluster.state} on {','.join(cluster.nodes or ['?'])}; "
                + _next_step(job))
    return _next_step(job)


def _next_step(job: Job) -> str:
    if job.state == "running":
        return (f"call get_verification_status with job_id={job.id!r} and wait_s=30 (it answers when the run "
                "ends), or cancel_verification")
    if job.state == "cancelled":
        return "cancelled; start a new run with run_verification when ready"
    if job.state == "failed":
        return "the run could not start or crashed in the server: read `error`, fix the input, run again"
    verdict = job.result.verdict if job.result is not None else None
    if verdict == "passed":
        return "verdict passed: enable the setting in the real job, then check its log with check_training_log"
    if verdict == "throughput-not-judged":
        return ("correctness verified, speed not judged (CPU run): to judge throughput, run on GPUs "
                f"(device='cuda'); the measured split per mode is in {job_uri(job.id)}")
    return (f"verdict {verdict}: read the failing criterion above (evidence in {job_uri(job.id)}), then call "
            "diagnose_failure with its summary or the failure message")


def _flags(data: Any) -> Any:
    """Every text of verify's summary with its `--steps 4` / `--device cuda` said as this tool's arguments."""
    if isinstance(data, str):
        return flags_as_arguments(data, "verify")
    if isinstance(data, list):
        return [_flags(x) for x in data]
    if isinstance(data, dict):
        return {k: _flags(v) for k, v in data.items()}
    return data


def status_of(job: Job, *, with_children: bool = False) -> Any:
    """The job's state and progress, and once it has finished the outcome `moe-overlap verify --format json`
    prints (verify/judge/outcome.py), fitted to a result's size; the report itself is the job's resource.

    The result models are imported here, on the first call: the server starts without them.
    """
    from moe_overlap.mcp.results import VerificationStatus, fit
    from moe_overlap.verify.judge.outcome import outcome

    tracker = job.view if isinstance(job.view, ProgressTracker) else None
    done = outcome(job.result) if job.result is not None else None
    return fit(VerificationStatus(
        job_id=job.id, state=job.state, elapsed_s=job.elapsed_s(),
        progress=tracker.current if tracker is not None else None,
        summary=_flags(done.summary.model_dump(mode="json")) if done else None,
        failure=done.failure[:MAX_FAILURE_CHARS] if done and done.failure else None,
        report_uri=job_uri(job.id) if done else None, out_dir=done.out_dir if done else None, error=job.error,
        live_child_processes=_job_processes() if with_children else None, next_step=next_step(job)))


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


def register_resources(server: MCPServer, jobs: JobManager) -> None:
    """report.json (compact) and report.md of every finished job, readable by URI."""

    def report_of(job_id: str, ctx: Context) -> Any:
        try:
            job = jobs.get(job_id, owner_of(ctx))  # another session's job is no such job here too
        except JobError as exc:
            raise ResourceNotFoundError(f"{exc}") from None
        if job.result is None:
            state = "still running" if job.state == "running" else f"{job.state} without a report"
            raise ResourceError(f"verification job {job_id!r} is {state}; read it once "
                                "get_verification_status says succeeded")
        return job.result

    @server.resource(JOB_URI.format(job_id="{job_id}", file="report.json"), mime_type="application/json",
                     name="verification-report", description="The full report of a verification job (schema: "
                     "moe-overlap://schemas/verification-report.schema.json)")
    def report_json(job_id: str, ctx: Context) -> str:
        return compact_json(report_of(job_id, ctx).model_dump(mode="json"))

    @server.resource(JOB_URI.format(job_id="{job_id}", file="report.md"), mime_type="text/markdown",
                     name="verification-report-md", description="The report of a verification job, for people")
    def report_md(job_id: str, ctx: Context) -> str:
        path = report_of(job_id, ctx).files.get("report.md")
        text = None
        if path:  # the run folder's reader: a plain file inside the job's folder, bounded, no link followed
            from moe_overlap.verify.rundir.read import RunFolderError, read_text

            try:
                text = read_text(Path(path).parent, Path(path).name)
            except RunFolderError as exc:
                raise ResourceError(f"job {job_id!r}: report.md cannot be read ({exc.message}); read report.json "
                                    "instead") from None
        if text is None:
            raise ResourceError(f"job {job_id!r} wrote no report.md; read report.json instead")
        return text


def tools(guard: ArgumentGuard, roots: AllowedRoots, jobs: JobManager, runs_dir: Path | None) -> list[Tool]:
    folder: list[Path] = [runs_dir] if runs_dir is not None else []

    def runs_folder() -> Path:
        if not folder:  # created on the first run only: a server that never verifies leaves nothing behind
            folder.append(Path(tempfile.mkdtemp(prefix="moe-overlap-mcp-runs-")))
        return folder[0]

    def options_for(inp: ins.RunVerificationInput) -> Any:
        from moe_overlap.verify.plan.build import VerifyInputError, make_plan
        from moe_overlap.verify.plan.options import VerifyOptions

        source = config_source(inp, roots)
        out = runs_folder() / f"run-{uuid.uuid4().hex[:12]}"
        from moe_overlap.mcp.inputs import SlurmJob

        job = inp.slurm or SlurmJob()
        try:
            options = VerifyOptions(config=source, nproc=inp.nproc, device=inp.device, steps=inp.steps,
                                    micro_batches=inp.micro_batches, modes=inp.modes, schedule=inp.schedule,
                                    fabric=inp.fabric, a2a=inp.a2a, timeout_s=inp.timeout_s, out=out,
                                    launcher=inp.launcher, nodes=job.nodes, gpus_per_node=job.gpus_per_node,
                                    partition=job.partition, account=job.account, time_limit=job.time)
            plan = make_plan(options, local=inp.launcher == "local")  # input errors: a ToolError, before any job
            if inp.launcher == "slurm":
                from moe_overlap.verify.run.launch_print import cluster_shape
                from moe_overlap.verify.run.slurm_job import SlurmError, require_client

                cluster_shape(plan, job.nodes, job.gpus_per_node)
                try:
                    require_client()
                except SlurmError as exc:
                    raise VerifyInputError(exc.message, field="launcher", fix=exc.fix) from None
        except (VerifyInputError, ValueError) as exc:
            raise as_tool_error(exc, "config") from None
        return options

    def start(inp: ins.RunVerificationInput, owner: str | None) -> Job:
        options = options_for(inp)
        tracker = ProgressTracker()

        def run(progress, cancel):
            from moe_overlap.verify.api import run_verification
            from moe_overlap.verify.run.slurm_run import run_on_slurm

            def forward(event: dict[str, Any]) -> None:
                tracker.feed(event)
                progress(event)

            # slurm: the job is scancelled (and gone from squeue) before this returns on a cancel
            runner = run_on_slurm if options.launcher == "slurm" else run_verification
            return runner(options, progress=forward, cancel=cancel)

        try:
            job = jobs.start(run, description=f"verify nproc={inp.nproc} steps={inp.steps} modes={inp.modes} "
                                              f"launcher={inp.launcher}",
                             owner=owner)
        except JobError as exc:
            raise ToolError(f"{exc}.") from None
        job.view = tracker
        return job

    async def run_verification(inp: ins.RunVerificationInput, ctx: Context) -> Any:
        job = await bounded(start, inp, owner_of(ctx), what="config")  # planning reads files, may probe GPUs
        if inp.background:
            return status_of(job)
        tracker: ProgressTracker = job.view
        sent = -1.0

        async def send_new() -> None:
            nonlocal sent
            for update in tracker.since(sent):  # every unit, also those done between two polls
                await ctx.report_progress(update.done, update.total, update.message)
                sent = update.done

        try:
            while not job.finished.is_set():
                await anyio.sleep(POLL_S)
                tracker.tick()
                await send_new()
            await send_new()  # the verdict
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

    def job_of(job_id: str, ctx: Context) -> Job:
        try:
            return jobs.get(job_id, owner_of(ctx))
        except JobError as exc:
            raise ToolError(f"`job_id`: {exc}. Fix: use the job_id that run_verification returned.") from None

    async def get_verification_status(inp: ins.StatusInput, ctx: Context) -> Any:
        job = job_of(inp.job_id, ctx)
        with anyio.move_on_after(inp.wait_s):
            while not job.finished.is_set():
                await anyio.sleep(POLL_S)
        return status_of(job)

    async def cancel_verification(inp: ins.CancelInput, ctx: Context) -> Any:
        job = job_of(inp.job_id, ctx)
        job.cancel_event.set()
        await _wait(job, inp.wait_s)
        return status_of(job, with_children=True)

    status = dict(result_schema="verification-status")
    return [
        model_tool(guard, name="run_verification", title="Run a verification", handler=run_verification,
                   result_schema="verification-status",
                   description="A/B training runs (baseline, overlap, overlap+wgrad) of our MoE layer, local or "
                               "on Slurm: loss, completion, throughput; report as a resource.",
                   # Writes a new report folder each call (not idempotent), deletes nothing; local ranks or
                   # the Slurm cluster this host already submits to (a closed set, not the open world).
                   hints=annotations(read_only=False, destructive=False, idempotent=False, open_world=False)),
        model_tool(guard, name="get_verification_status", title="Verification status", handler=get_verification_status,
                   description="State, progress and, when done, the summary of a verification job; waits up to "
                               "wait_s for it to end.",
                   hints=annotations(read_only=True, destructive=False, idempotent=True, open_world=False), **status),
        model_tool(guard, name="cancel_verification", title="Cancel a verification",
                   handler=cancel_verification, result_schema="verification-status",
                   description="Cancel a verification job and wait for its processes to end (live_child_processes "
                               "[] is clean).",
                   # Stops a run (its partial results are lost): destructive; cancelling twice is harmless.
                   hints=annotations(read_only=False, destructive=True, idempotent=True, open_world=False)),
    ]
