"""The throughput judgement of one overlap mode against the baseline, from paired steps (torch-free).

The modes run interleaved (step i of every mode back to back, worker.py), so the time ratio of step i is a
paired sample: a drift of the machine hits both members of a pair alike and cancels in the ratio.

    r_i        = baseline step time / mode step time          (tokens/s ratio; > 1: the mode is faster)
    ratio      = exp(median(log r_i))                          (steps after the warm-up)
    band       = ratio x exp(+-h),  h = t(n-1) x 1.2533 x sd / sqrt(n), at least MIN_HALF_WIDTH
                 (a ~95% interval of that median: sd robust, from the median absolute deviation; 1.2533 is the
                 standard error of a median over that of a mean; t, Student's quantile, for few steps)
    tolerance  = the slowdown still counted as "does not regress" (TOLERANCE, per device; docs/verify.md)

Outcome, against the line ``1 - tolerance``:
    pass          the whole band lies above it (faster, or slower by less than the tolerance)
    fail          the whole band lies below it (slower than the tolerance allows)
    inconclusive  the band straddles it; ``steps_to_settle`` says how many steps per mode would give a band
                  narrow enough (the band shrinks as 1/sqrt(n)), or None when no number would (the ratio sits
                  on the line)
"""

from __future__ import annotations

import math
import statistics
from typing import Any

WARMUP_STEPS = 1
# The band never gets narrower than +-1%: timer resolution and per-step jitter that no number of steps removes.
MIN_HALF_WIDTH = math.log(1.01)
# Slowdown tolerated before throughput counts as regressed, per device (reasons in docs/verify.md).
TOLERANCE = {"cuda": 0.02, "cpu": 0.05}
# Student's t, two-sided 95%, by degrees of freedom (1..30); 1.96 beyond.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
# Where more steps cannot settle it in reasonable time, say so instead of naming a huge number.
MAX_STEPS_TO_SUGGEST = 5000


def t95(dof: int) -> float:
    return _T95[dof - 1] if 1 <= dof <= len(_T95) else 1.96


def robust_sd(xs: list[float]) -> float:
    """Standard deviation from the median absolute deviation (step times have heavy tails)."""
    med = statistics.median(xs)
    return 1.4826 * statistics.median(abs(x - med) for x in xs)


def _steps_to_settle(center: float, sd: float, n: int, line: float) -> int | None:
    """Steps per mode (warm-up included) after which the band would no longer straddle ``line``."""
    distance = abs(center - line)
    if distance <= MIN_HALF_WIDTH:
        return None  # the floor of the band alone straddles the line
    if sd <= 0:
        return n + WARMUP_STEPS
    # Large-sample form: h(m) = 1.96 x 1.2533 x sd / sqrt(m) < distance.
    needed = math.ceil((1.96 * 1.2533 * sd / distance) ** 2) + 1
    needed = max(needed, n + 1)
    return needed + WARMUP_STEPS if needed <= MAX_STEPS_TO_SUGGEST else None


def compare(base_times: list[float], mode_times: list[float], tolerance: float) -> dict[str, Any]:
    """The paired comparison of one mode's step times with the baseline's (see the module docstring)."""
    n_all = min(len(base_times), len(mode_times))
    pairs = [(b, o) for b, o in zip(base_times[WARMUP_STEPS:n_all], mode_times[WARMUP_STEPS:n_all], strict=True)
             if b > 0 and o > 0]
    logs = [math.log(b / o) for b, o in pairs]
    line = math.log(1.0 - tolerance)
    if len(logs) < 2:
        return {"outcome": "insufficient-data", "steps_compared": len(logs), "tolerance": tolerance,
                "warmup_steps_excluded": WARMUP_STEPS,
                "reason": f"{len(logs)} paired step(s) after the warm-up; at least 2 are needed"}
    n = len(logs)
    center = statistics.median(logs)
    sd = robust_sd(logs)
    half = max(MIN_HALF_WIDTH, t95(n - 1) * 1.2533 * sd / math.sqrt(n))
    low, high = center - half, center + half
    if low >= line:
        outcome = "pass"
    elif high < line:
        outcome = "fail"
    else:
        outcome = "inconclusive"
    change = "faster" if low > 0 else "slower" if high < 0 else "no clear change"
    settle = _steps_to_settle(center, sd, n, line) if outcome == "inconclusive" else None
    med = statistics.median
    return {
        "outcome": outcome, "change": change,
        "ratio": round(math.exp(center), 4), "band_low": round(math.exp(low), 4),
        "band_high": round(math.exp(high), 4), "half_width": round(math.expm1(half), 4),
        "tolerance": tolerance, "steps_compared": n, "warmup_steps_excluded": WARMUP_STEPS,
        "steps_to_settle": settle,
        "baseline_median_step_s": med(b for b, _ in pairs), "mode_median_step_s": med(o for _, o in pairs),
        "method": "paired median of per-step tokens/s ratios, ~95% band (robust sd, Student t)",
    }


def describe(mode: str, c: dict[str, Any]) -> str:
    """One line for people: ratio, band, tolerance, outcome (and what would settle an inconclusive one)."""
    if c["outcome"] == "insufficient-data":
        return f"{mode}: not enough steps ({c['reason']})"
    text = (f"{mode}: x{c['ratio']:.3f} tokens/s (band x{c['band_low']:.3f}-x{c['band_high']:.3f}, "
            f"tolerance -{c['tolerance']:.0%}): {c['outcome']}")
    if c["outcome"] == "inconclusive":
        steps = c.get("steps_to_settle")
        text += (f", about {steps} steps per mode would settle it (--steps {steps})" if steps else
                 ", the ratio sits on the tolerance line: more steps would not settle it")
    return text
