"""The verdict, by the seed's four success criteria, each with its evidence (torch-free).

  1 config-validation  the validator accepts the dispatcher and overlap parameters
  2 completes-cleanly  every rank finished every step: no hang, no crash, no assertion error in any log
  3 throughput         tokens/s of each overlap mode over the baseline from paired (interleaved) steps, with a
                       noise band measured from the repeated steps; `regressed` only below the band
  4 loss-trajectory    per-step max absolute / relative difference to the baseline, and whether it is bitwise equal
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from moe_overlap.verify.report_model import Criterion, ModeRun

# Relative loss tolerance per precision. fp32 schedules reorder nothing that matters at this size, so any
# difference beyond rounding noise is a bug; bf16/fp16 round every GEMM output, and a different chunking
# or accumulation order shows up after a few optimizer steps.
LOSS_RTOL = {"fp32": 1e-4, "bf16": 3e-2, "fp16": 3e-2}
MIN_BAND = 0.01  # a ratio within 1% is never called a change, whatever the measured noise
WARMUP_STEPS = 1


def _robust_sd(xs: list[float]) -> float:
    """Standard deviation from the median absolute deviation (step times have heavy tails)."""
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs)


def throughput_comparison(base: ModeRun, other: ModeRun) -> dict[str, Any]:
    """Tokens/s ratio other/baseline from paired steps, and its noise band.

    The modes run interleaved (step i of every mode back to back), so step i's time ratio is a paired
    sample: machine drift cancels within a pair. ratio = exp(median(log r_i)); the band is 2 standard
    errors of that median (1.2533 x sd / sqrt(n) for a median), never below MIN_BAND.
    """
    n = min(len(base.steps), len(other.steps))
    pairs = [(base.steps[i].step_time_s, other.steps[i].step_time_s) for i in range(WARMUP_STEPS, n)]
    logs = [math.log(b / o) for b, o in pairs if b > 0 and o > 0]
    if len(logs) < 2:
        return {"mode": other.mode, "status": "insufficient-data", "steps_compared": len(logs)}
    ratio = math.exp(statistics.median(logs))  # tokens/s ratio = inverse step-time ratio
    band = max(MIN_BAND, math.expm1(2.0 * 1.2533 * _robust_sd(logs) / math.sqrt(len(logs))))
    status = "improved" if ratio > 1 + band else "regressed" if ratio < 1 / (1 + band) else "neutral"
    med = statistics.median
    return {"mode": other.mode, "status": status, "ratio": round(ratio, 4), "noise_band": round(band, 4),
            "baseline_median_step_s": med(b for b, _ in pairs), "mode_median_step_s": med(o for _, o in pairs),
            "baseline_tokens_per_s": round(med(s.tokens_per_s for s in base.steps[WARMUP_STEPS:n]), 1),
            "mode_tokens_per_s": round(med(s.tokens_per_s for s in other.steps[WARMUP_STEPS:n]), 1),
            "steps_compared": len(logs), "warmup_steps_excluded": WARMUP_STEPS, "method": "paired median"}


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


def criterion_throughput(runs: list[ModeRun], binding: bool) -> Criterion:
    title = "throughput improves or at least does not regress (outside the noise band)"
    base, others = _baseline_and_others(runs)
    if base is None or not others:
        return Criterion(id="throughput", title=title, status="skipped", binding=binding, summary=NEEDS_BASELINE)
    comps = [throughput_comparison(base, o) for o in others]
    if any(c["status"] == "insufficient-data" for c in comps):
        status, summary = "skipped", "not enough completed steps to measure throughput"
    else:
        regressed = [c for c in comps if c["status"] == "regressed"]
        status = ("fail" if binding else "warn") if regressed else "pass"
        summary = "; ".join(f"{c['mode']}: x{c['ratio']:.3f} tokens/s (noise band ±{c['noise_band']:.1%}, "
                            f"{c['status']})" for c in comps)
        if regressed and not binding:
            summary += " [not binding on this device: see notes]"
    return Criterion(id="throughput", title=title, status=status, binding=binding, summary=summary,
                     evidence={"comparisons": comps})


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
    """passed only when every binding criterion was actually assessed (e.g. --modes overlap alone cannot
    compare anything with a baseline: inconclusive, not passed)."""
    if launch_status != "completed":
        return launch_status
    if any(c.status == "fail" and c.binding for c in criteria):
        return "failed"
    return "inconclusive" if any(c.status == "skipped" and c.binding for c in criteria) else "passed"
