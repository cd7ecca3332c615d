"""The verdict logic on synthetic step records (torch-free): noise band, loss tolerance, bitwise flag."""

from __future__ import annotations

import random

from moe_overlap.verify.judge import (
    criterion_loss,
    criterion_throughput,
    loss_comparison,
    throughput_comparison,
    verdict,
)
from moe_overlap.verify.report_model import ModeRun, StepRecord


def _run(mode, times, losses=None):
    losses = losses or [5.0 - 0.1 * i for i in range(len(times))]
    steps = [StepRecord(step=i, loss=loss, loss_hex=float(loss).hex(), step_time_s=t, tokens_per_s=1000 / t,
                        peak_memory_bytes=0) for i, (t, loss) in enumerate(zip(times, losses, strict=True))]
    return ModeRun(mode=mode, schedule="none" if mode == "baseline" else "1f1b",
                   overlap_moe_expert_parallel_comm=mode != "baseline", delay_wgrad_compute=False,
                   status="completed", steps=steps)


def _noisy(mean, rel, n, seed):
    rng = random.Random(seed)
    return [mean * (1 + rng.uniform(-rel, rel)) for _ in range(n)]


def test_within_noise_is_neutral_not_regressed():
    base = _run("baseline", [2.0] + _noisy(1.0, 0.10, 10, 1))
    slower = _run("overlap", [2.0] + _noisy(1.03, 0.10, 10, 2))  # 3% slower inside ±10% noise
    c = throughput_comparison(base, slower)
    assert c["status"] == "neutral" and c["noise_band"] > 0.03


def test_outside_band_is_regressed_and_binding_decides():
    base = _run("baseline", [2.0] + _noisy(1.0, 0.01, 10, 3))
    slow = _run("overlap", [2.0] + _noisy(1.5, 0.01, 10, 4))
    assert throughput_comparison(base, slow)["status"] == "regressed"
    assert criterion_throughput([base, slow], binding=True).status == "fail"
    assert criterion_throughput([base, slow], binding=False).status == "warn"
    fast = _run("overlap", [2.0] + _noisy(0.5, 0.01, 10, 5))
    c = throughput_comparison(base, fast)
    assert c["status"] == "improved" and 1.9 < c["ratio"] < 2.1


def test_warmup_step_is_excluded():
    base = _run("baseline", [100.0, 1.0, 1.0, 1.0])
    other = _run("overlap", [1.0, 1.0, 1.0, 1.0])
    assert throughput_comparison(base, other)["status"] == "neutral"


def test_loss_bitwise_and_tolerance():
    base = _run("baseline", [1.0] * 4, [5.0, 4.0, 3.0, 2.0])
    same = _run("overlap", [1.0] * 4, [5.0, 4.0, 3.0, 2.0])
    close = _run("overlap", [1.0] * 4, [5.0, 4.0, 3.0 * (1 + 1e-6), 2.0])
    far = _run("overlap", [1.0] * 4, [5.0, 4.0 * 1.01, 3.0, 2.0])
    assert loss_comparison(base, same, 1e-4)["bitwise_equal"]
    c = loss_comparison(base, close, 1e-4)
    assert not c["bitwise_equal"] and c["within_tolerance"]
    c = loss_comparison(base, far, 1e-4)
    assert not c["within_tolerance"] and c["first_step_over_tolerance"] == 1
    assert criterion_loss([base, far], "fp32").status == "fail"
    assert criterion_loss([base, far], "bf16").status == "pass"  # 1% is inside bf16's tolerance


def test_verdict_order():
    base = _run("baseline", [1.0] * 4, [5.0, 4.0, 3.0, 2.0])
    far = _run("overlap", [1.0] * 4, [5.0, 4.5, 3.0, 2.0])
    crit = [criterion_loss([base, far], "fp32")]
    assert verdict("completed", crit) == "failed"
    assert verdict("hang", crit) == "hang"
    assert verdict("completed", [criterion_loss([base, base.model_copy(update={"mode": "overlap"})], "fp32")]) == "passed"


def test_paired_steps_cancel_machine_drift():
    """The machine slows down 3x during the run; overlap is 10% faster within every pair of steps."""
    drift = [1.0 + 0.2 * i for i in range(11)]
    base = _run("baseline", drift)
    other = _run("overlap", [t / 1.1 for t in drift])
    c = throughput_comparison(base, other)
    assert c["status"] == "improved" and abs(c["ratio"] - 1.1) < 1e-9 and c["noise_band"] == 0.01


def test_nothing_to_compare_is_inconclusive():
    only = _run("overlap", [1.0] * 4)
    crit = [criterion_loss([only], "fp32"), criterion_throughput([only], binding=False)]
    assert crit[0].status == "skipped"
    assert verdict("completed", crit) == "inconclusive"
