"""The verdict, by the seed's four success criteria, each with its evidence (torch-free).

  1 config-validation  the validator accepts the dispatcher and overlap parameters
  2 completes-cleanly  every rank finished every step: no hang, no crash, no assertion error in any log
  3 throughput         tokens/s of each overlap mode over the baseline from paired (interleaved) steps, judged
                       pass / fail / inconclusive against a tolerance (throughput.py); binding on CUDA only
  4 loss-trajectory    per-step max absolute / relative difference to the baseline, and whether it is bitwise equal
"""

from __future__ import annotations

import statistics
from typing import Any

from moe_overlap.verify.judge.report_model import Criterion, ModeRun
from moe_overlap.verify.judge.throughput import TOLERANCE, WARMUP_STEPS, compare, describe

# Relative loss tolerance per precision. fp32 schedules reorder nothing that matters at this size, so any
# difference beyond rounding noise is a bug; bf16/fp16 round every GEMM output, and a different chunking
# or accumulation order shows up after a few optimizer steps.
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-2}


def throughput_comparison(base: ModeRun, other: ModeRun, tolerance: float) -> dict[str, Any]:
    """Tokens/s of ``other`` over the baseline from paired steps, judged against ``tolerance`` (throughput.py)."""
    c = compare([s.step_time_s for s in base.steps], [s.step_time_s for s in other.steps], tolerance)
    n = min(len(base.steps), len(other.steps))
    if c["outcome"] != "insufficient-data":
        med = statistics.median
        c["baseline_tokens_per_s"] = round(med(s.tokens_per_s for s in base.steps[WARMUP_STEPS:n]), 1)
        c["mode_tokens_per_s"] = round(med(s.tokens_per_s for s in other.steps[WARMUP_STEPS:n]), 1)
    return {"mode": other.mode, **c}


def loss_comparison(base: ModeRun, other: ModeRun, rtol: float) -> dict[str, Any]:
    n = min(len(base.steps), len(other.steps))
    abs_d = [abs(base.steps[i].loss - other.steps[i].loss) for i in range(n)]
    rel_d = [a / max(abs(base.steps[i].loss), 1e-12) for i, a in enumerate(abs_d)]
    bitwise = n > 0 and all(base.steps[i].loss_hex == other.steps[i].loss_hex for i in range(n))
    first_bad = next((i for i, r in enumerate(rel_d) if r > rtol), None)
    return {"mode": other.mode, "steps_compared": n, "max_abs_diff": max(abs_d, default=0.0),
            "max_rel_diff": max(rel_d, default=0.0), "rtol": rtol, "bitwise_equal": bitwise,
            "first_step_over_tolerance": first_bad, "within_tolerance": n > 0 and first_bad is None,
            "per_step_abs_diff": abs_d}


def criterion_validation(validation: dict[str, Any]) -> Criterion:
    title = "config validation passes for the selected dispatcher and overlap parameters"
    if not validation.get("available"):
        return Criterion(id="config-validation", title=title, status="skipped", binding=True,
                         summary=validation.get("reason", "validator not available"), evidence=validation)
    ok = all(r.get("valid") for r in validation.get("results", {}).values())
    errors = [f"{m}: {f['rule']}" for m, r in validation.get("results", {}).items() for f in r.get("findings", [])
              if f.get("severity") == "error" and not f.get("waived")]
    summary = "valid" if ok else "invalid: " + ", ".join(errors)
    waived = validation.get("waived") or []
    if ok and waived:
        summary += f" ({len(waived)} rule(s) waived for the included implementation, see evidence)"
    return Criterion(id="config-validation", title=title, status="pass" if ok else "fail", binding=True,
                     summary=summary, evidence=validation)


def criterion_completion(launch: dict[str, Any], runs: list[ModeRun], steps: int,
                         log_checks: dict[str, Any]) -> Criterion:
    title = "training completes with no hang and no assertion failure"
    incomplete = [r.mode for r in runs if len(r.steps) < steps]
    log_problems = {m: c.get("problems") for m, c in log_checks.items() if c.get("problems")}
    ok = launch["status"] == "completed" and not incomplete and not log_problems
    if launch["status"] != "completed":
        summary = f"{launch['status']}: {launch.get('message', '')}".strip()
    elif incomplete:
        summary = "modes stopped early: " + ", ".join(incomplete)
    elif log_problems:
        summary = "errors in training logs: " + ", ".join(log_problems)
    else:
        summary = f"all {len(runs)} mode(s) ran {steps} steps on every rank; logs clean"
    return Criterion(id="completes-cleanly", title=title, status="pass" if ok else "fail", binding=True,
                     summary=summary, evidence={"launch": launch, "steps_per_mode": {r.mode: len(r.steps) for r in runs},
                                                "log_checks": log_checks})


NEEDS_BASELINE = "needs the baseline and at least one overlap mode"


def _baseline_and_others(runs: list[ModeRun]) -> tuple[ModeRun | None, list[ModeRun]]:
    """The baseline run, and the overlap runs the comparisons hold against it."""
    return next((r for r in runs if r.mode == "baseline"), None), [r for r in runs if r.mode != "baseline"]


def criterion_throughput(runs: list[ModeRun], device: str, binding: bool) -> Criterion:
    """Every overlap mode against the baseline at ``device``'s tolerance; ``binding`` False: measured and
    reported, but the verdict does not rest on it (it then says "throughput not judged")."""
    title = "throughput improves or does not regress beyond the tolerance"
    base, others = _baseline_and_others(runs)
    tolerance = TOLERANCE.get(device, TOLERANCE["cuda"])
    if base is None or not others:
        return Criterion(id="throughput", title=title, status="skipped", binding=binding, summary=NEEDS_BASELINE)
    comps = [throughput_comparison(base, o, tolerance) for o in others]
    outcomes = {c["outcome"] for c in comps}
    if "insufficient-data" in outcomes:
        status = "skipped"
    else:
        status = "fail" if "fail" in outcomes else "inconclusive" if "inconclusive" in outcomes else "pass"
    summary = "; ".join(describe(c["mode"], c) for c in comps)
    if not binding:
        summary = f"not judged on --device {device} (measured only, see docs/verify.md): {summary}"
    return Criterion(id="throughput", title=title, status=status, binding=binding, summary=summary,
                     evidence={"comparisons": comps, "tolerance": tolerance, "device": device})


def criterion_loss(runs: list[ModeRun], precision: str) -> Criterion:
    title = "loss trajectory matches the baseline"
    base, others = _baseline_and_others(runs)
    if base is None or not others:
        return Criterion(id="loss-trajectory", title=title, status="skipped", binding=True, summary=NEEDS_BASELINE)
    rtol = LOSS_RTOL[precision]
    comps = [loss_comparison(base, o, rtol) for o in others]
    if any(c["steps_compared"] == 0 for c in comps):
        return Criterion(id="loss-trajectory", title=title, status="skipped", binding=True,
                         summary="a mode recorded no step", evidence={"comparisons": comps})
    ok = all(c["within_tolerance"] for c in comps)
    summary = "; ".join(f"{c['mode']}: " + ("bitwise equal" if c["bitwise_equal"] else
                        f"max rel diff {c['max_rel_diff']:.2e} (rtol {rtol:g})") +
                        ("" if c["within_tolerance"] else f", over tolerance from step {c['first_step_over_tolerance']}")
                        for c in comps)
    fell = {"first": base.steps[0].loss, "last": base.steps[-1].loss}
    return Criterion(id="loss-trajectory", title=title, status="pass" if ok else "fail", binding=True,
                     summary=summary, evidence={"comparisons": comps, "baseline_loss": fell})


def verdict(launch_status: str, criteria: list[Criterion]) -> str:
    """``passed`` only when every criterion was judged and passed. A binding criterion that could not be
    assessed or settled (no baseline, too few steps, a band wider than the tolerance) gives
    ``inconclusive``; a criterion that is not binding (throughput on CPU) gives ``throughput-not-judged``
    when everything else passed: never ``passed``."""
    if launch_status != "completed":
        return launch_status
    if any(c.status == "fail" and c.binding for c in criteria):
        return "failed"
    if any(c.binding and c.status in ("skipped", "inconclusive") for c in criteria):
        return "inconclusive"
    if any(not c.binding for c in criteria):
        return "throughput-not-judged"
    return "passed"


def _short_throughput(c: Criterion) -> str:
    comps = c.evidence.get("comparisons") or []
    parts = [f"{x['mode']} x{x['ratio']:.3f} ({x['outcome']})" for x in comps if "ratio" in x]
    return ", ".join(parts) or c.summary


def headline(verdict_: str, criteria: list[Criterion], launch_message: str = "") -> str:
    """The report's one-line summary: what the verdict rests on, in words."""
    tp = next((c for c in criteria if c.id == "throughput"), None)
    failed = [c for c in criteria if c.binding and c.status == "fail"]
    open_ = [c for c in criteria if c.binding and c.status in ("skipped", "inconclusive")]
    if verdict_ == "passed":
        return "all success criteria met, throughput judged: " + (_short_throughput(tp) if tp else "")
    if verdict_ == "throughput-not-judged":
        device = tp.evidence.get("device", "this device") if tp else "this device"
        measured = f"measured {_short_throughput(tp)}, not binding" if tp and tp.status != "skipped" else "not measured"
        return (f"throughput not judged (--device {device}: {measured}); passed: "
                + ", ".join(c.id for c in criteria if c.binding))
    if verdict_ == "failed":
        return "criteria failed: " + "; ".join(
            f"{c.id} ({_short_throughput(c) if c.id == 'throughput' else c.summary})" for c in failed)
    if verdict_ == "inconclusive":
        return "not settled: " + "; ".join(f"{c.id} ({c.summary})" for c in open_)
    return f"{verdict_}: {launch_message}".rstrip(": ")
