"""The verdict logic on synthetic step records (torch-free): throughput band and tolerance, loss tolerance,
bitwise flag, verdict words."""

from __future__ import annotations

import random

import pytest

from moe_overlap.verify.judge.criteria import (
    criterion_loss,
    criterion_throughput,
    headline,
    loss_comparison,
    throughput_comparison,
    verdict,
)
from moe_overlap.verify.judge.report_model import Criterion, ModeRun, StepRecord


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


def test_slower_within_tolerance_passes_and_beyond_fails():
    base = _run("baseline", [2.0] + _noisy(1.0, 0.002, 30, 1))
    slightly = _run("overlap", [2.0] + _noisy(1.01, 0.002, 30, 2))  # 1% slower, tolerance 2% on cuda
    c = throughput_comparison(base, slightly, 0.02)
    assert c["outcome"] == "pass" and c["change"] == "slower" and c["band_low"] > 0.98
    slow = _run("overlap", [2.0] + _noisy(1.05, 0.002, 30, 3))
    c = throughput_comparison(base, slow, 0.02)
    assert c["outcome"] == "fail" and c["band_high"] < 0.98
    fast = _run("overlap", [2.0] + _noisy(0.5, 0.01, 10, 5))
    c = throughput_comparison(base, fast, 0.02)
    assert c["outcome"] == "pass" and c["change"] == "faster" and 1.9 < c["ratio"] < 2.1


def test_wide_band_is_inconclusive_and_says_how_many_steps():
    """±20% step noise, 3% slower: the band straddles the -2% line; more steps would settle it."""
    base = _run("baseline", [2.0] + _noisy(1.0, 0.2, 8, 6))
    other = _run("overlap", [2.0] + _noisy(1.06, 0.2, 8, 7))
    c = throughput_comparison(base, other, 0.02)
    assert c["outcome"] == "inconclusive" and c["band_low"] < 0.98 < c["band_high"]
    assert c["steps_to_settle"] is None or c["steps_to_settle"] > 9
    crit = criterion_throughput([base, other], "cuda", binding=True)
    assert crit.status == "inconclusive" and crit.judged and verdict("completed", [crit]) == "inconclusive"
    assert "would settle it" in crit.summary or "sits on the tolerance line" in crit.summary


@pytest.mark.parametrize("factor", [1.25, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("noise", [0.01, 0.1, 0.5, 0.9])
def test_slower_modes_never_pass(factor, noise):
    """However noisy the steps, a mode 1.25x-3x slower is never judged pass, and the verdict is never passed."""
    for seed in range(5):
        base = _run("baseline", [2.0] + _noisy(1.0, noise, 12, seed))
        slow = _run("overlap", [2.0 * factor] + _noisy(factor, noise, 12, 100 + seed))
        for device, binding in (("cuda", True), ("cpu", False)):
            crit = criterion_throughput([base, slow], device, binding)
            assert crit.status in ("fail", "inconclusive"), crit.summary
            assert verdict("completed", [crit]) != "passed"


def test_not_binding_on_cpu_gives_throughput_not_judged():
    base = _run("baseline", [2.0] + _noisy(1.0, 0.01, 10, 3))
    slow = _run("overlap", [2.0] + _noisy(1.5, 0.01, 10, 4))
    assert throughput_comparison(base, slow, 0.02)["outcome"] == "fail"
    assert criterion_throughput([base, slow], "cuda", binding=True).status == "fail"
    crit = criterion_throughput([base, slow], "cpu", binding=False)
    assert crit.status == "fail" and not crit.binding and not crit.judged
    loss = criterion_loss([base, base.model_copy(update={"mode": "overlap"})], "fp32")
    v = verdict("completed", [loss, crit])
    assert v == "throughput-not-judged"
    text = headline(v, [loss, crit])
    assert text.startswith("throughput not judged") and "all success criteria met" not in text


def test_warmup_step_is_excluded():
    base = _run("baseline", [100.0, 1.0, 1.0, 1.0])
    other = _run("overlap", [1.0, 1.0, 1.0, 1.0])
    assert throughput_comparison(base, other, 0.02)["outcome"] == "pass"


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
    c = throughput_comparison(base, other, 0.02)
    assert c["outcome"] == "pass" and c["change"] == "faster" and abs(c["ratio"] - 1.1) < 1e-9
    assert c["half_width"] == 0.01


def test_nothing_to_compare_is_inconclusive():
    only = _run("overlap", [1.0] * 4)
    crit = [criterion_loss([only], "fp32"), criterion_throughput([only], "cpu", binding=False)]
    assert crit[0].status == "skipped" and not crit[0].judged and crit[0].binding
    assert verdict("completed", crit) == "inconclusive"


def test_judged_follows_binding_and_status():
    c = Criterion(id="throughput", title="t", status="pass", binding=False, judged=True, summary="s")
    assert c.judged is False  # set from binding and status, whatever the input says
    assert Criterion(id="throughput", title="t", status="inconclusive", binding=True, summary="s").judged
