"""`moe-overlap verify --launcher slurm`: the verification as one Slurm batch job, tracked and judged here
(torch-free in this process).

    report = run_on_slurm(VerifyOptions(launcher="slurm", nproc=16, device="cuda"), progress=print)

The plan, config.json and plan.json go into --out as for --print-launch; the sbatch script is
launch_print.slurm_script (the one --print-launch slurm prints), written as OUT/job.sbatch and submitted with
``sbatch --parsable``. While the job is pending or running, its state (squeue/scontrol) and rank 0's records
in the shared folder become the same progress events as a local run. When the job ends the folder is judged
by the offline judge (judge/offline.py, as `verify --judge OUT`), and the report names the job (recorded in
OUT/cluster_job.json at submission and at the end, so a later `--judge OUT` names it too). Ctrl-C, the
caller's cancel event, --timeout (counted from the job's start: queue time is not the run's) and a rank
silent past --hang-timeout scancel the job and wait until squeue no longer lists it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moe_overlap.verify.judge.offline import judge_run_dir
from moe_overlap.verify.judge.report_model import CLUSTER_JOB_FILE, ClusterJob, VerificationReport
from moe_overlap.verify.plan.build import VerifyInputError, make_plan, prepare_out
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.plan.plan_file import save_plan
from moe_overlap.verify.run import slurm_job
from moe_overlap.verify.run.interrupts import interrupts_once
from moe_overlap.verify.run.launch_print import slurm_script
from moe_overlap.verify.run.progress import record_event
from moe_overlap.verify.run.records import RecordTail, rank_dir, records_path
from moe_overlap.verify.rundir.read import RunFolderError
from moe_overlap.verify.rundir.write import write_text

POLL_S = 0.5
STATE_EVERY_S = 2.0  # squeue/scontrol at most this often: slurmctld serves everyone
SCRIPT = "job.sbatch"

Progress = Callable[[dict[str, Any]], None]


def write_script(options: VerifyOptions):
    """Plan, prepare --out (config.json, plan.json) and write the sbatch script; returns (plan, script path)."""
    plan = make_plan(options, local=False)  # the ranks run on the allocation's nodes, not here
    prepare_out(plan)
    save_plan(plan)
    text = slurm_script(plan, nodes=options.nodes, gpus_per_node=options.gpus_per_node,
                        partition=options.partition, account=options.account, time_limit=options.time_limit,
                        timeout_s=options.timeout_s,
                        extra=["--inject-fault", options.inject_fault] if options.inject_fault else [])  # tests
    path = plan.out / SCRIPT
    with open(path, "x", encoding="utf-8") as f:  # "x": never a file or a link planted in its place
        f.write(text)
    rank_dir(plan.out).mkdir(parents=True, exist_ok=True)
    return plan, path


class _Watch:
    """The job's state and rank 0's progress, read from Slurm and from the shared folder."""

    def __init__(self, plan, job_id: str, emit: Callable[[dict[str, Any]], None]):
        self.plan, self.job_id, self.emit = plan, job_id, emit
        self.tails = {r: RecordTail(records_path(plan.out, r)) for r in range(plan.nproc)}
        self.stepped = dict.fromkeys(range(plan.nproc), False)
        self.last_record_t: dict[int, float] = {}
        self.finished: set[int] = set()  # wrote its last record ("done"): silent from then on, rightly
        self.state = slurm_job.JobState(job_id=job_id, state="SUBMITTED")
        self.running_since: float | None = None
        self._asked = 0.0

    def poll_records(self) -> None:
        for r, tail in self.tails.items():
            for rec in tail.poll():
                self.stepped[r] = self.stepped[r] or rec.get("kind") == "step"
                if isinstance(rec.get("t"), int | float):
                    self.last_record_t[r] = float(rec["t"])
                if rec.get("kind") in ("done", "error"):
                    self.finished.add(r)
                event = record_event(rec, nproc=self.plan.nproc, max_steps=self.plan.max_steps) if r == 0 else None
                if event is not None:
                    self.emit(event)

    def poll_state(self, *, force: bool = False) -> slurm_job.JobState:
        now = time.monotonic()
        if not force and now - self._asked < STATE_EVERY_S:
            return self.state
        self._asked = now
        try:
            new = slurm_job.job_state(self.job_id)
        except slurm_job.SlurmError:
            return self.state  # slurmctld busy or restarting: ask again at the next poll
        if new.state == "UNKNOWN" and not self.state.ended:
            return self.state  # a moment between squeue and scontrol: keep the last known state
        if (new.state, new.reason) != (self.state.state, self.state.reason):
            self.emit({"event": "slurm", **new.to_dict()})
        if new.state == "RUNNING" and self.running_since is None:
            self.running_since = now
            for t in self.tails.values():
                t.last_seen = now  # the hang clock starts when the ranks can run, not at submission
        self.state = new
        return new

    def last_t(self, r: int) -> float:
        return self.last_record_t.get(r, 0.0)

    def hang(self, hang_timeout_s: float, startup_s: float, job_id: str) -> tuple[str, str, int | None] | None:
        """A hang once a rank that has not finished is silent past its limit. The ranks of a hung collective all
        go silent together and their stacks cannot be read from here: a rank is named only when its last
        record is clearly older than every other silent rank's, else the silent ranks are listed."""
        if self.running_since is None:
            return None
        now = time.monotonic()
        silent = [r for r, tail in self.tails.items() if r not in self.finished
                  and now - tail.last_seen > (hang_timeout_s if self.stepped[r] else max(hang_timeout_s, startup_s))]
        if not silent:
            return None
        first = min(silent, key=self.last_t)
        rest = [self.last_t(r) for r in silent if r != first]
        named = first if not rest or min(rest) - self.last_t(first) > 1.0 else None
        who = f"rank {named}" if named is not None else "ranks " + ", ".join(map(str, silent))
        return ("hang", f"{who} sent no heartbeat for {hang_timeout_s:g} s (Slurm job {job_id} scancelled; "
                        "ranks waiting in one collective go silent together: read each rank's logs)", named)


def run_on_slurm(options: VerifyOptions, progress: Progress | None = None,
                 cancel: threading.Event | None = None, *, startup_timeout_s: float = 300.0) -> VerificationReport:
    t0 = time.monotonic()
    broken: list[str] = []
    unsaved: list[str] = []  # the job record could not be written (a note; not a broken progress callback)

    def emit(event: dict[str, Any]) -> None:
        if progress is None or broken:
            return
        try:
            progress({**event, "elapsed_s": round(time.monotonic() - t0, 2)})
        except Exception as exc:  # noqa: BLE001 - a gone consumer must not leave a job behind
            broken.append(f"progress callback failed and was switched off: {exc!r}")

    try:
        slurm_job.require_client()  # before anything is written: no Slurm here is an input error
    except slurm_job.SlurmError as exc:
        raise VerifyInputError(f"--launcher slurm: {exc.message}", field="launcher", fix=exc.fix) from None
    plan, script = write_script(options)
    emit({"event": "start", "modes": [s.name for s in plan.specs], "nproc": plan.nproc, "steps": plan.cfg.steps,
          "max_steps": plan.max_steps, "out": str(plan.out)})
    ended: tuple[str, str, int | None] | None = None
    with interrupts_once() as guard:
        guard.holding = True  # a Ctrl-C now would leave a submitted job untracked: it waits for the job id
        try:
            job_id = slurm_job.submit(script)
            # Recorded at once (Ctrl-C still waits): if this process stops before the job ends, --judge OUT
            # still names the job.
            save_job_record(plan.out, _job_record(slurm_job.JobState(job_id=job_id, state="SUBMITTED"), script),
                            unsaved)
        except slurm_job.SlurmError as exc:
            raise VerifyInputError(f"--launcher slurm: {exc.message}", field="launcher", fix=exc.fix) from None
        finally:
            guard.holding = False
        emit({"event": "slurm", "job_id": job_id, "state": "SUBMITTED", "script": str(script)})
        watch = _Watch(plan, job_id, emit)
        try:
            while True:
                watch.poll_records()
                state = watch.poll_state()
                if state.ended and not slurm_job.in_queue(job_id):
                    break
                if cancel is not None and cancel.is_set():
                    ended = ("cancelled", f"cancelled by the caller (Slurm job {job_id} scancelled)", None)
                elif watch.running_since is not None and time.monotonic() - watch.running_since > options.timeout_s:
                    ended = ("timeout", f"the run exceeded --timeout {options.timeout_s:g} s (Slurm job {job_id} "
                                        "scancelled)", None)
                else:
                    ended = watch.hang(options.hang_timeout_s, startup_timeout_s, job_id)
                if ended is not None:
                    break
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            ended = ("cancelled", f"interrupted (Ctrl-C); Slurm job {job_id} scancelled", None)
        finally:
            guard.hold()  # from here on Ctrl-C waits: the job is cancelled and the report written
            try:
                if not watch.state.ended or slurm_job.in_queue(job_id):
                    watch.state = slurm_job.cancel(job_id)
            except slurm_job.SlurmError as exc:
                broken.append(f"scancel {job_id} failed ({exc.message}): check `squeue -j {job_id}` and "
                              f"scancel it yourself")
        final = watch.poll_state(force=True)
        slurm_job.forget(job_id)
        watch.poll_records()
        emit({"event": "judge"})
        record = _job_record(final, script)
        save_job_record(plan.out, record, unsaved)
        report = judge_run_dir(plan.out, cluster_job=record, ended=ended,
                               notes=_job_notes(final, ended) + unsaved + broken, command=_command(options))
    emit({"event": "done", "verdict": report.verdict, "out": str(plan.out), "job_id": job_id})
    return report


def _job_record(state: slurm_job.JobState, script: Path) -> dict[str, Any]:
    out = script.parent / f"slurm-{state.job_id}.out"
    return {"job_id": state.job_id, "state": state.state, "nodes": state.nodes, "exit_code": state.exit_code,
            "script": str(script), "output": str(out) if os.path.isfile(out) else None}


def save_job_record(out: Path, record: dict[str, Any], notes: list[str]) -> None:
    """OUT/cluster_job.json (the ClusterJob of the report), written without following a link (rundir/write.py);
    a folder that cannot take it costs a note, never the tracking of a submitted job."""
    try:
        write_text(out, CLUSTER_JOB_FILE, ClusterJob.model_validate(record).model_dump_json(indent=2) + "\n")
    except (RunFolderError, ValidationError) as exc:
        why = exc.message if isinstance(exc, RunFolderError) else f"not a ClusterJob: {exc.errors()[0]['msg']}"
        note = f"{CLUSTER_JOB_FILE} not written ({why}): `verify --judge` of this folder will not name the job"
        if note not in notes:
            notes.append(note)


def _job_notes(state: slurm_job.JobState, ended) -> list[str]:
    if ended is None and state.state not in ("COMPLETED", "UNKNOWN"):
        return [f"Slurm job {state.job_id} ended {state.state} (exit code {state.exit_code}, reason {state.reason}):"
                f" a node or the scheduler stopped it; the ranks' records say how far each rank got"]
    return []


def _command(options: VerifyOptions) -> str:
    from moe_overlap.verify.api import options_command

    parts = [options_command(options), "--launcher slurm"]
    for flag, value in (("--nodes", options.nodes), ("--gpus-per-node", options.gpus_per_node),
                        ("--partition", options.partition), ("--account", options.account),
                        ("--time", options.time_limit)):
        if value is not None:
            parts.append(f"{flag} {value}")
    return " ".join(parts)


__all__ = ["run_on_slurm", "write_script", "save_job_record", "SCRIPT"]
