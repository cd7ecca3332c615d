"""run_verification: plan, validate, launch the ranks, judge, write the report (torch-free in this process).

    report = run_verification(VerifyOptions(), progress=print, cancel=threading.Event())

`progress(dict)` receives {"event": "start"|"ranks"|"init"|"mode"|"step"|"judge"|"done", "mode", "step", "steps",
"elapsed_s", ...}; verify.run.progress turns them into one growing count, which the CLI prints on stderr and the
MCP server sends as notifications/progress. Setting `cancel` kills every rank; the report is
still written (verdict `cancelled`). Bad input raises VerifyInputError before anything is launched.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moe_overlap.verify.judge.criteria import (
    criterion_completion,
    criterion_loss,
    criterion_throughput,
    criterion_validation,
    headline,
    verdict,
)
from moe_overlap.verify.judge.explain import build_analysis, margin_of
from moe_overlap.verify.judge.report import write_outputs
from moe_overlap.verify.judge.report_model import (
    ModeRun,
    RankFailure,
    RunEnvironment,
    StepRecord,
    VerificationReport,
)
from moe_overlap.verify.plan.build import (
    Plan,
    VerifyInputError,
    ep1_check,
    make_plan,
    prepare_out,
    validate_modes,
)
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.plan.plan_file import save_plan
from moe_overlap.verify.run.interrupts import interrupts_once
from moe_overlap.verify.run.launch_print import rank_environment, worker_options
from moe_overlap.verify.run.launcher import LaunchResult, launch
from moe_overlap.verify.run.progress import record_event
from moe_overlap.verify.run.records import mode_log_path
from moe_overlap.verify.rundir.read import RunFolderError, exists, read_text

# One rank's training log as the judge checks it: head (the config dump) and tail (the failure) beyond this; all
# logs of a run together: the rest is not checked and the evidence says so. Why bounds: a log replaced by a 2 GB
# sparse file took 9 s to check at 8 MB (the project's fuzz, benchmarks/results/fuzz_folders_judge.json).
MAX_LOG_BYTES = 1 << 20
MAX_LOGS_BYTES = 16 << 20

__all__ = ["run_verification", "VerifyInputError", "VerifyOptions"]

Progress = Callable[[dict[str, Any]], None]


def _torch_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def _runs(plan: Plan, records: dict[int, list[dict[str, Any]]]) -> list[ModeRun]:
    steps: dict[str, list[StepRecord]] = {s.name: [] for s in plan.specs}
    notes: dict[str, list[str]] = {s.name: [] for s in plan.specs}
    started: set[str] = set()
    for rec in records.get(0, []):
        mode = rec.get("mode")
        if not isinstance(mode, str) or mode not in steps:
            continue  # a damaged or foreign record (a judged folder holds whatever was written there)
        if rec.get("kind") == "mode_start":
            started.add(mode)
        elif rec.get("kind") == "step":
            try:
                steps[mode].append(StepRecord.model_validate({k: rec[k] for k in StepRecord.model_fields if k in rec}))
            except ValidationError:
                continue
        elif rec.get("kind") == "mode_end":
            notes[mode] = [str(n)[:500] for n in rec.get("notes") or [] if isinstance(rec.get("notes"), list)]
    runs = []
    for s in plan.specs:
        done = len(steps[s.name]) >= plan.cfg.steps
        status = "completed" if done else "incomplete" if s.name in started else "not-run"
        logs = [str(mode_log_path(plan.out, s.name, r)) for r in range(plan.nproc)
                if exists(plan.out, str(mode_log_path(Path(), s.name, r)))]
        runs.append(ModeRun(mode=s.name, schedule=s.schedule, overlap_moe_expert_parallel_comm=s.overlap,
                            delay_wgrad_compute=s.delay_wgrad, status=status, steps=steps[s.name],
                            notes=notes[s.name], log_files=logs))
    return runs


def _log_checks(plan: Plan, runs: list[ModeRun]) -> dict[str, Any]:
    """The seed's log checks on every rank's log of every mode that ran."""
    from moe_overlap.skill.diagnose.logs import check_training_log

    out: dict[str, Any] = {}
    budget = MAX_LOGS_BYTES
    for run, spec in zip(runs, plan.specs, strict=True):
        problems, confirmed = [], []
        for path in run.log_files:
            if budget <= 0:
                problems.append(f"{os.path.basename(path)}: not checked (the run's logs are over "
                                f"{MAX_LOGS_BYTES >> 20} MB; check it with `moe-overlap check-logs {path}`)")
                continue
            # The run folder's reader: a plain file inside the folder, head and tail beyond the bound (a log
            # linked to /dev/zero, a FIFO or a link out of the folder is reported, never read).
            try:
                text = read_text(plan.out, os.path.relpath(path, plan.out), max_bytes=MAX_LOG_BYTES)
            except RunFolderError as exc:
                problems.append(exc.message)
                confirmed.append(False)
                continue
            budget -= len(text or "")
            res = check_training_log(text or "", expect_overlap=spec.overlap, expect_delay_wgrad=spec.delay_wgrad)
            problems += [f"{os.path.basename(path)}: {c.message}" for c in res.checks if c.status == "fail"]
            confirmed.append(res.ok)
        out[run.mode] = {"files": len(run.log_files), "all_ok": all(confirmed) and bool(confirmed),
                         "problems": problems[:10]}
    return out


def _lost_port_race(result) -> bool:
    no_step = not any(r.get("kind") == "step" for recs in result.records.values() for r in recs)
    return result.status == "crashed" and no_step and "Address already in use" in (result.traceback or "")


def build_report(plan: Plan, result: LaunchResult, validation: dict[str, Any], *, started_at: str, t0: float,
                 command: str | None, extra_notes: list[str] = (),
                 cluster_job: dict[str, Any] | None = None) -> VerificationReport:
    """Judge a finished launch by the four criteria and write report.json / report.md / loss.png."""
    runs = _runs(plan, result.records)
    log_checks = _log_checks(plan, runs)
    launch_ev = {"status": result.status, "message": result.message, "returncodes": result.returncodes,
                 "elapsed_s": round(result.elapsed_s, 2), "pids": result.pids, "ranks": result.ranks}
    # On CPU, gloo ranks on shared cores are not the workload overlap is for: measured, reported, not judged.
    # At EP 1 on one GPU (the tool's EP 1 check) there is nothing to overlap: measured, reported, not judged.
    throughput_binding = plan.device == "cuda" and not ep1_check(plan)
    criteria = [criterion_validation(validation), criterion_completion(launch_ev, runs, plan.cfg.steps, log_checks),
                criterion_throughput(runs, plan.device, throughput_binding), criterion_loss(runs, plan.cfg.precision)]
    v = verdict(result.status, criteria)
    notes = list(plan.notes) + list(extra_notes)
    if ep1_check(plan):
        notes.append("EP 1 check: throughput is measured but not judged (at EP 1 there is no all-to-all for the "
                     "overlap to hide): the verdict is at best throughput-not-judged")
    elif not throughput_binding:
        notes.append("throughput is measured but not judged on --device cpu (gloo on shared CPU cores is not the "
                     "target workload): the verdict is at best throughput-not-judged; run with --device cuda for "
                     "a judged throughput criterion")
    failure = None
    if result.status != "completed":
        failure = RankFailure(rank=result.failed_rank, kind=result.status, message=result.message,
                              traceback=result.traceback, stacks=result.stacks)
    torch_version = next((rec.get("torch") for rec in result.records.get(0, []) if rec.get("kind") == "init"),
                         None) or _torch_version()
    summary = headline(v, criteria, result.message)
    rank0 = result.records.get(0, [])
    init = next((rec for rec in rank0 if rec.get("kind") == "init"), {})
    analysis = None
    if any(r.steps for r in runs):
        analysis = build_analysis(
            plan.cfg, nproc=plan.nproc, device=plan.device, backend="nccl" if plan.device == "cuda" else "gloo",
            fabric=plan.fabric, transport=str(init.get("transport") or ""), runs=runs, throughput=criteria[2],
            pieces_record=next((rec for rec in rank0 if rec.get("kind") == "pieces"), None),
            schedules={s.name: s.schedule for s in plan.specs}, explain=plan.explain,
            sm_margin=margin_of(init.get("sm_margin")))
        extended = next((rec for rec in rank0 if rec.get("kind") == "steps_extended"), None)
        if extended and not all(isinstance(extended.get(k), int) for k in ("ran", "planned", "max_steps")):
            extended = None  # a damaged record: nothing to say about extra steps
        if extended and extended["ran"] > extended["planned"]:
            notes.append(f"throughput not settled after {extended['planned']} steps: ran {extended['ran']} per mode "
                         f"(at most {extended['max_steps']}, --max-steps)"
                         + ("" if extended.get("settled") else f"; still not settled (stopped by the "
                                                                f"{extended.get('stopped_by', 'limit')})"))
        elif extended and not extended.get("settled"):
            notes.append(f"throughput not settled after {extended['planned']} steps and not extended: "
                         f"stopped by the {extended.get('stopped_by', 'limit')} (raise --timeout or --max-steps)")
        why = analysis.explanation
        if why is not None and why.pays is False and v in ("failed", "inconclusive", "throughput-not-judged"):
            summary += f". Why: {why.cause}"
    report = VerificationReport(
        verdict=v, summary=summary, started_at=started_at, elapsed_s=round(time.monotonic() - t0, 2),
        command=command, config_source=plan.config_source, config=plan.cfg.model_dump(),
        mapping_notes=plan.mapping_notes, modes=[s.name for s in plan.specs], criteria=criteria, runs=runs,
        failure=failure, analysis=analysis, out_dir=str(plan.out), notes=notes, cluster_job=cluster_job,
        environment=RunEnvironment(device=plan.device, backend="nccl" if plan.device == "cuda" else "gloo",
                                   nproc=plan.nproc, python=sys.version.split()[0], torch=torch_version,
                                   platform=platform.platform(), hostname=socket.gethostname(),
                                   fabric=plan.fabric, a2a_transport=init.get("transport"),
                                   baseline_transport=init.get("baseline_transport"),
                                   a2a_alone_ms=init.get("a2a_alone_ms"),
                                   sm_margin=init.get("sm_margin"), graphs=init.get("graphs")))
    return write_outputs(report, plan.out)


def run_verification(options: VerifyOptions, progress: Progress | None = None,
                     cancel: threading.Event | None = None) -> VerificationReport:
    if options.launcher != "local":  # a batch job is tracked from here: verify/run/slurm_run.py
        raise VerifyInputError(f"run_verification runs local ranks; launcher {options.launcher!r} goes through "
                               "moe_overlap.verify.run.slurm_run.run_on_slurm", field="launcher",
                               fix="call run_on_slurm(options), or leave launcher at 'local'")
    started_at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    plan = make_plan(options)  # raises VerifyInputError: nothing launched yet
    config_path = prepare_out(plan)  # raises VerifyInputError too
    save_plan(plan)  # the folder can be judged again later: moe-overlap verify --judge OUT
    validation = validate_modes(plan)

    progress_broken: list[str] = []

    def emit(event: dict[str, Any]) -> None:
        # A failing progress consumer (closed pipe, gone MCP client) must not abort the run or the report.
        if progress is None or progress_broken:
            return
        try:
            progress({**event, "elapsed_s": round(time.monotonic() - t0, 2)})
        except Exception as exc:  # noqa: BLE001
            progress_broken.append(f"progress callback failed and was switched off: {exc!r}")

    def on_record(rank: int, rec: dict[str, Any]) -> None:
        event = record_event(rec, nproc=plan.nproc, max_steps=plan.max_steps) if rank == 0 else None
        if event is not None:
            emit(event)

    emit({"event": "start", "modes": [s.name for s in plan.specs], "nproc": plan.nproc, "steps": plan.cfg.steps,
          "max_steps": plan.max_steps, "out": str(plan.out)})
    with interrupts_once() as guard:
        for attempt in range(2):
            result = launch(nproc=plan.nproc, device=plan.device, config_path=config_path,
                            modes_arg=json.dumps([s.to_dict() for s in plan.specs]), out=plan.out,
                            timeout_s=options.timeout_s, hang_timeout_s=options.hang_timeout_s,
                            inject_fault=options.inject_fault, on_record=on_record, cancel=cancel,
                            extra_args=worker_options(plan) + _budget_args(plan, options.timeout_s),
                            extra_env=rank_environment(plan))
            if attempt == 0 and _lost_port_race(result):
                # Another process took the free port between our probe and rank 0's bind: start over once.
                for name in ("ranks", "logs"):
                    shutil.rmtree(plan.out / name, ignore_errors=True)
                continue
            break
        guard.hold()  # from here on Ctrl-C waits: the report is written whatever happens
        emit({"event": "judge"})
        report = build_report(plan, result, validation, started_at=started_at, t0=t0,
                              command=options_command(options), extra_notes=progress_broken)
    emit({"event": "done", "verdict": report.verdict, "out": str(plan.out)})
    return report


def _budget_args(plan: Plan, timeout_s: float) -> list[str]:
    """Extra steps (--max-steps) may use up to 40% of --timeout in step time: start-up, the pieces and the
    report need the rest, and a run stopped by its timeout judges nothing."""
    return ["--step-budget-s", f"{0.4 * timeout_s:g}"] if plan.max_steps > plan.cfg.steps else []


def options_command(options: VerifyOptions) -> str:
    """The `moe-overlap verify` command line equivalent to `options` (for the report)."""
    parts = ["moe-overlap", "verify"]
    if options.config is not None and not isinstance(options.config, dict):
        parts.append(str(options.config))
    for flag, value in (("--nproc", options.nproc), ("--steps", options.steps), ("--max-steps", options.max_steps),
                        ("--micro-batches", options.micro_batches), ("--schedule", options.schedule)):
        if value is not None:
            parts += [flag, str(value)]
    if options.device != "cpu":
        parts += ["--device", options.device]
    if options.fabric != "native":
        parts += ["--fabric", options.fabric]
    if options.a2a:
        parts += ["--a2a", options.a2a]
    if options.sm_margin != "auto":
        parts += ["--sm-margin", str(options.sm_margin)]
    if not options.explain:
        parts.append("--no-explain")
    if options.modes:
        parts += ["--modes", ",".join(options.modes)]
    return " ".join(parts)
