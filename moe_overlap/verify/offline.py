"""Judge a run that `moe-overlap verify` did not launch itself: torchrun / Slurm (torch-free).

`--print-launch` writes ``config.json`` and ``plan.json`` into --out; after the cluster job,
``moe-overlap verify --judge OUT`` reads the ranks' records and logs there and writes the same report
as a local run (the launcher's watchdog was not there: an unfinished rank is reported from its records).
A local run writes plan.json too, so its folder can be judged again (e.g. after a change of the judge).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from moe_overlap.verify.config import VerifyConfig, VerifyConfigError, parse_megatron, read_source
from moe_overlap.verify.launcher import LaunchResult
from moe_overlap.verify.modes import ModeSpec
from moe_overlap.verify.plan import Plan, VerifyInputError, prepare_out, validate_modes, validated_config
from moe_overlap.verify.plan_file import PLAN_FILE, save_plan
from moe_overlap.verify.records import read_all, records_path
from moe_overlap.verify.report_model import VerificationReport


def write_plan(plan: Plan) -> Path:
    """Everything `judge_run_dir` needs to rebuild the plan (config.json is written beside it)."""
    prepare_out(plan)
    return save_plan(plan)


def _load_plan(out: Path) -> Plan:
    try:
        data = json.loads((out / PLAN_FILE).read_text(encoding="utf-8"))
        cfg = VerifyConfig.model_validate_json((out / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerifyInputError(f"{out} is not a run folder written by --print-launch ({exc})", field="judge",
                               fix="run `moe-overlap verify --print-launch torchrun --out DIR` first") from None
    raw = data.get("raw_source")
    try:  # the judge's own single pass over a Megatron source (criterion 1 validates it as the user gave it)
        parsed = parse_megatron(read_source(raw)) if data["config_kind"] == "megatron" else None
    except VerifyConfigError as exc:
        raise VerifyInputError(f"the run's config source: {exc.message}", field=exc.field, fix=exc.fix) from None
    return Plan(cfg=cfg, config_source=data["config_source"], config_kind=data["config_kind"], raw_source=raw,
                megatron=validated_config(cfg, parsed), nproc=int(data["nproc"]), device=data["device"],
                specs=[ModeSpec(**s) for s in data["specs"]], out=out, notes=list(data.get("notes", [])),
                mapping_notes=list(data.get("mapping_notes", [])), fabric=str(data.get("fabric") or "native"),
                a2a=data.get("a2a"), explain=bool(data.get("explain", True)),
                max_steps=int(data.get("max_steps") or cfg.steps))


def _status(records: dict[int, list[dict[str, Any]]]) -> LaunchResult:
    errors = [(rec["t"], r, rec.get("traceback")) for r, recs in records.items() for rec in recs
              if rec.get("kind") == "error"]
    if errors:
        _, rank, tb = min(errors)
        return LaunchResult(status="crashed", failed_rank=rank, message=f"rank {rank} raised an exception",
                            traceback=tb, records=records)
    unfinished = [r for r, recs in records.items() if not recs or recs[-1].get("kind") != "done"]
    if unfinished:
        r = unfinished[0]
        last = records[r][-1] if records[r] else {}
        return LaunchResult(status="crashed", failed_rank=r, records=records,
                            message=f"rank {r} stopped without finishing (last record: {last.get('kind', 'none')} "
                                    f"mode={last.get('mode')} step={last.get('step')}); killed or still running?")
    return LaunchResult(status="completed", records=records)


def judge_run_dir(out: str | Path) -> VerificationReport:
    from moe_overlap.verify.api import build_report

    out = Path(out)
    plan = _load_plan(out)
    records = {r: read_all(records_path(out, r)) for r in range(plan.nproc)}
    result = _status(records)
    result.returncodes = {r: None for r in range(plan.nproc)}
    first = min((rec["t"] for recs in records.values() for rec in recs), default=time.time())
    last = max((rec["t"] for recs in records.values() for rec in recs), default=first)
    result.elapsed_s = last - first
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(first))
    return build_report(plan, result, validate_modes(plan), started_at=started, t0=time.monotonic() - result.elapsed_s,
                        command=f"moe-overlap verify --judge {out}",
                        extra_notes=["judged offline from the ranks' records (no launcher watchdog)"])
