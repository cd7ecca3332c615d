"""Judge a run that `moe-overlap verify` did not launch itself: torchrun / Slurm (torch-free).

`--print-launch` writes ``config.json`` and ``plan.json`` into --out; after the cluster job,
``moe-overlap verify --judge OUT`` reads the ranks' records and logs there and writes the same report
as a local run (the launcher's watchdog was not there: an unfinished rank is reported from its records).
A local run writes plan.json too, so its folder can be judged again (e.g. after a change of the judge).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from moe_overlap.verify.judge.attribution import RankEnd, describe, error_of, first_failure, is_peer_error
from moe_overlap.verify.judge.report_model import (
    CLUSTER_JOB_FILE,
    MAX_CLUSTER_JOB_BYTES,
    ClusterJob,
    VerificationReport,
)
from moe_overlap.verify.plan.build import (
    Plan,
    VerifyInputError,
    prepare_out,
    validate_modes,
    validated_config,
)
from moe_overlap.verify.plan.config import VerifyConfig, VerifyConfigError, parse_megatron, read_source
from moe_overlap.verify.plan.modes import ModeSpec
from moe_overlap.verify.plan.outdir import MARKER, is_ours
from moe_overlap.verify.plan.plan_file import MAX_PLAN_BYTES, PLAN_FILE, PlanFile, save_plan
from moe_overlap.verify.run.launcher import LaunchResult
from moe_overlap.verify.run.records import RankRecord, records_path
from moe_overlap.verify.rundir.read import (
    MAX_RECORDS_BYTES,
    RunFolderError,
    exists,
    folder_root,
    read_model,
    read_records,
)


def write_plan(plan: Plan) -> Path:
    """Everything `judge_run_dir` needs to rebuild the plan (config.json is written beside it)."""
    prepare_out(plan)
    return save_plan(plan)


def _not_a_run_folder(out: Path, why: str) -> VerifyInputError:
    return VerifyInputError(f"{out} is not a run folder written by --print-launch ({why})", field="judge",
                            fix="run `moe-overlap verify --print-launch torchrun --out DIR` first, then the printed "
                                "command, then --judge DIR")


def _load_plan(out: Path) -> Plan:
    try:
        root = folder_root(out)
    except RunFolderError as exc:
        raise _not_a_run_folder(out, exc.message) from None
    if not is_ours(root):
        raise _not_a_run_folder(out, f"no {MARKER} in it")
    try:
        data = read_model(root, PLAN_FILE, PlanFile, max_bytes=MAX_PLAN_BYTES, what="run file")
        cfg = read_model(root, "config.json", VerifyConfig, max_bytes=MAX_PLAN_BYTES, what="run file")
    except RunFolderError as exc:
        raise _not_a_run_folder(out, exc.message) from None
    raw = data.raw_source
    try:  # the judge's own single pass over a Megatron source (criterion 1 validates it as the user gave it)
        parsed = parse_megatron(read_source(raw)) if data.config_kind == "megatron" and raw is not None else None
    except VerifyConfigError as exc:
        raise VerifyInputError(f"the run's config source: {exc.message}", field=exc.field, fix=exc.fix) from None
    except (ValueError, TypeError, RecursionError) as exc:  # a hand-made raw_source the parser cannot read
        raise _not_a_run_folder(out, f"{PLAN_FILE}: raw_source cannot be read as a config "
                                     f"({type(exc).__name__})") from None
    return Plan(cfg=cfg, config_source=data.config_source, config_kind=data.config_kind, raw_source=raw,
                megatron=validated_config(cfg, parsed), nproc=data.nproc, device=data.device,
                specs=[ModeSpec(**s.model_dump()) for s in data.specs], out=root, notes=list(data.notes),
                mapping_notes=list(data.mapping_notes), run_id=data.run_id or "", fabric=data.fabric, a2a=data.a2a,
                sm_margin=data.sm_margin, explain=data.explain, max_steps=data.max_steps or cfg.steps)


def _records(out: Path, rank: int) -> list[dict[str, Any]]:
    try:
        return read_records(out, str(records_path(Path(), rank)), RankRecord, max_bytes=MAX_RECORDS_BYTES)
    except RunFolderError as exc:
        raise _not_a_run_folder(out, exc.message) from None


def _cluster_job(out: Path) -> tuple[dict[str, Any] | None, list[str]]:
    """The batch job the folder records (OUT/cluster_job.json, verify/run/slurm_run.py), and notes: none when
    there is no record (a local or torchrun run); a damaged one is left out of the report with a note, and the
    run is judged all the same (the job is bookkeeping, not evidence)."""
    if not exists(out, CLUSTER_JOB_FILE):
        return None, []
    try:
        job = read_model(out, CLUSTER_JOB_FILE, ClusterJob, max_bytes=MAX_CLUSTER_JOB_BYTES, what="cluster-job record")
    except RunFolderError as exc:
        return None, [f"the cluster job is not named: {exc.message} (the launcher writes {CLUSTER_JOB_FILE}; "
                      "the run itself is judged from its records)"]
    notes = []
    if job.state == "SUBMITTED":  # written at submission, never updated: the tracker stopped before the job ended
        notes.append(f"{CLUSTER_JOB_FILE} records Slurm job {job.job_id} only as submitted: the process that "
                     f"tracked it stopped before the job ended; `sacct -j {job.job_id}` (or `scontrol show job "
                     f"{job.job_id}` within a few minutes of its end) tells how it ended")
    return job.model_dump(), notes


def _status(records: dict[int, list[dict[str, Any]]]) -> LaunchResult:
    """The run as its records tell it (no exit codes offline): a rank with an error of its own, else one that
    stopped without finishing and without an error (killed), else the first peer error (attribution.py)."""
    ends = []
    for r, recs in records.items():
        error_at, tb = error_of(recs)
        last = recs[-1] if recs else None
        finished = last is not None and last.get("kind") == "done"
        ends.append(RankEnd(rank=r, pid=recs[0].get("pid") if recs and isinstance(recs[0].get("pid"), int) else None,
                            state="exited" if finished or error_at is not None else "unfinished",
                            error_at=error_at, peer_error=is_peer_error(tb),
                            last_record=(f"{last.get('kind')} mode={last.get('mode')} step={last.get('step')}"[:200]
                                         if last else None)))
    first = first_failure(ends)
    ranks = [e.to_dict() for e in ends]
    if first is None:
        return LaunchResult(status="completed", records=records, ranks=ranks)
    _, tb = error_of(records[first.rank])
    return LaunchResult(status="crashed", failed_rank=first.rank, message=describe(first), traceback=tb,
                        records=records, ranks=ranks)


def judge_run_dir(out: str | Path, *, cluster_job: dict[str, Any] | None = None,
                  ended: tuple[str, str, int | None] | None = None, notes: list[str] = (), command: str | None = None) -> VerificationReport:
    """`ended` (status, message, rank): how a launcher that tracked the job saw it end (cancelled, timeout, hang),
    which the records alone cannot tell; `cluster_job` names the batch job in the report (default: what the
    folder's cluster_job.json records, so a re-judged Slurm run keeps it)."""
    from moe_overlap.verify.api import build_report

    out = Path(out)
    plan = _load_plan(out)
    records = {r: _records(plan.out, r) for r in range(plan.nproc)}
    result = _status(records)
    job_notes: list[str] = []
    if cluster_job is None:
        cluster_job, job_notes = _cluster_job(plan.out)
    if ended is not None and not all(recs and recs[-1].get("kind") == "done" for recs in records.values()):
        # The launcher stopped the job (scancel): the ranks' ends follow from that, not the other way round.
        result.status, result.message, result.failed_rank = ended
        result.traceback = None
    result.returncodes = {r: None for r in range(plan.nproc)}
    first = min((rec["t"] for recs in records.values() for rec in recs), default=time.time())
    last = max((rec["t"] for recs in records.values() for rec in recs), default=first)
    result.elapsed_s = last - first
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first))
    try:
        return build_report(plan, result, validate_modes(plan), started_at=started,
                            t0=time.monotonic() - result.elapsed_s, command=command or f"moe-overlap verify --judge {out}",
                            cluster_job=cluster_job,
                            extra_notes=[*notes, *job_notes, "judged offline from the ranks' records (no launcher watchdog)"])
    except RunFolderError as exc:  # a report file cannot be written (a folder sits at its name)
        raise VerifyInputError(f"the report cannot be written: {exc.message}", field="judge", fix=exc.fix) from None
