"""The report's explanation on synthetic runs and pieces (torch-free): the step split per mode, the estimator's
prediction fed by the pieces, the measured cause, the summary every surface shows, and the run as calibration."""

from __future__ import annotations

import json

import pytest

from moe_overlap.verify.calibrate.run_calibration import (
    RunCalibrationError,
    calibration_from_pieces,
    calibration_from_run,
)
from moe_overlap.verify.judge.analysis_model import StepPieces
from moe_overlap.verify.judge.criteria import criterion_throughput
from moe_overlap.verify.judge.explain import build_analysis
from moe_overlap.verify.judge.report_model import ModeRun, StepRecord
from moe_overlap.verify.judge.summary import render_summary, verification_summary
from moe_overlap.verify.plan.config import VerifyConfig

CFG = VerifyConfig(precision="bf16", micro_batches=4, num_layers=2)


def _run(mode, step_s, n=12, jitter=0.002):
    steps = [StepRecord(step=i, loss=5.0 - 0.1 * i, loss_hex=(5.0 - 0.1 * i).hex(),
                        step_time_s=step_s * (1 + jitter * ((i * 7919) % 5 - 2)), tokens_per_s=1000 / step_s,
                        peak_memory_bytes=2**30 + i, optimizer_s=0.001) for i in range(n)]
    return ModeRun(mode=mode, schedule="none" if mode == "baseline" else "1f1b",
                   overlap_moe_expert_parallel_comm=mode != "baseline", delay_wgrad_compute=mode == "overlap+wgrad",
                   status="completed", steps=steps)


def _pieces(comm_s=0.010, experts_s=0.030, probe_eff=0.0):
    a2a, exp = 0.004, 0.006
    return {"comm_s": comm_s, "a2a_s": comm_s * 0.9, "count_exchange_s": comm_s * 0.1, "experts_s": experts_s,
            "experts_fwd_s": experts_s / 3, "experts_dgrad_s": experts_s / 3, "experts_wgrad_s": experts_s / 3,
            "probe": {"a2a_s": a2a, "experts_s": exp, "both_s": a2a + exp - probe_eff * min(a2a, exp),
                      "overlap_efficiency": probe_eff},
            "a2a_bytes_off_rank": 32 * 2**20, "rows_received": 4096, "expert_flops": int(2e12), "a2a_calls": 32,
            "count_exchanges": 8, "rounds": 3, "layers": 2, "micro_batches": 4, "model_of": "baseline"}


def _analysis(runs, pieces, device="cuda", fabric="native", transport="nccl (the process group's own)"):
    tp = criterion_throughput(runs, device, device == "cuda")
    return build_analysis(CFG, nproc=2, device=device, backend="nccl", fabric=fabric, transport=transport,
                          runs=runs, throughput=tp, pieces_record=pieces,
                          schedules={"baseline": "none", "overlap": "1f1b", "overlap+wgrad": "1f1b"}), tp


def test_split_follows_the_definitions():
    runs = [_run("baseline", 0.100), _run("overlap", 0.095)]
    a, _ = _analysis(runs, _pieces(comm_s=0.020))
    base, ovl = a.modes
    assert base.compute_s == pytest.approx(0.080, rel=1e-2) and base.exposed_comm_s == pytest.approx(0.020, rel=5e-2)
    assert ovl.exposed_comm_s == pytest.approx(0.015, rel=0.1) and ovl.hidden_comm_s == pytest.approx(0.005, rel=0.2)
    assert ovl.overlap_efficiency == pytest.approx(0.25, abs=0.05)  # (80 + 20 - 95) / 20
    assert base.peak_memory_bytes >= 2**30 and base.optimizer_s == pytest.approx(0.001)


def test_prediction_is_fed_by_the_pieces_and_sits_beside_the_measured_ratio():
    runs = [_run("baseline", 0.100), _run("overlap", 0.104), _run("overlap+wgrad", 0.103)]
    a, _ = _analysis(runs, _pieces(comm_s=0.020, probe_eff=0.0))
    assert a.prediction.available and a.prediction.overlap_efficiency == 0.0
    assert a.prediction.request["calibration"]["source"].startswith("this run")
    # Efficiency 0: the estimator adds nothing to hide; its no-overlap step is the measured baseline.
    assert a.prediction.step_s["none"] == pytest.approx(0.100, rel=0.05)
    for row in a.modes[1:]:
        assert row.predicted_ratio == pytest.approx(1.0, abs=0.02)
        assert row.prediction_error == pytest.approx(row.predicted_ratio / row.measured_ratio - 1, abs=1e-3)
    assert a.modes[0].predicted_ratio is None
    full, _ = _analysis(runs, _pieces(comm_s=0.020, probe_eff=1.0))
    assert full.prediction.overlap_efficiency == 1.0 and full.modes[1].predicted_ratio > 1.05


def test_small_comm_share_is_the_cause_with_its_ceiling():
    runs = [_run("baseline", 0.100), _run("overlap", 0.107)]
    a, tp = _analysis(runs, _pieces(comm_s=0.006))
    assert tp.status == "fail"
    e = a.explanation
    assert e.pays is False and "all-to-all is 6% of the step on NVLink" in e.cause and "at most" in e.cause
    assert e.ceiling_ratio == pytest.approx(0.100 / 0.094, rel=0.02)
    assert any("more EP ranks" in x for x in e.what_would_change_it)
    assert any("--fabric emulated-net" in x for x in e.what_would_change_it)
    assert any("--a2a ce" in x for x in e.what_would_change_it)


def test_contention_is_the_cause_when_the_probe_hides_nothing():
    runs = [_run("baseline", 0.100), _run("overlap", 0.103)]
    a, _ = _analysis(runs, _pieces(comm_s=0.030, probe_eff=0.02))
    assert "take SMs" in a.explanation.cause and "30% of the step" in a.explanation.cause
    net, _ = _analysis(runs, _pieces(comm_s=0.030, probe_eff=0.9), fabric="emulated-net")
    assert "schedule costs more than it hides" in net.explanation.cause
    assert not any("--fabric emulated-net" in x for x in net.explanation.what_would_change_it)


def test_overlap_that_pays_says_what_it_hid():
    runs = [_run("baseline", 0.100), _run("overlap", 0.080)]
    a, tp = _analysis(runs, _pieces(comm_s=0.040, probe_eff=0.9), fabric="emulated-net")
    assert tp.status == "pass" and a.explanation.pays
    assert "hid 20.0 ms" in a.explanation.cause and not a.explanation.what_would_change_it


def test_without_pieces_the_split_and_prediction_say_why():
    runs = [_run("baseline", 0.100), _run("overlap", 0.100)]
    a, _ = _analysis(runs, None)
    assert not a.available and "stopped before the end" in a.reason
    assert not a.prediction.available and a.modes[1].compute_s is None
    one = build_analysis(CFG, nproc=1, device="cuda", backend="nccl", fabric="native", transport="", runs=runs,
                         throughput=None, pieces_record={**_pieces(), "a2a_bytes_off_rank": 0}, schedules={})
    assert not one.prediction.available and "EP 1" in one.prediction.reason


def test_summary_carries_the_split_and_the_cause():
    from moe_overlap.verify.judge.report_model import RunEnvironment, VerificationReport

    runs = [_run("baseline", 0.100), _run("overlap", 0.107)]
    a, tp = _analysis(runs, _pieces(comm_s=0.006))
    report = VerificationReport(verdict="failed", summary="criteria failed: throughput", started_at="t",
                                elapsed_s=1.0, config_source="x", config={}, modes=["baseline", "overlap"],
                                criteria=[tp], runs=runs, analysis=a, out_dir="/tmp/x",
                                environment=RunEnvironment(device="cuda", backend="nccl", nproc=2, python="3",
                                                           platform="p", hostname="h"))
    s = verification_summary(report)
    assert s.verdict == "failed" and s.why == a.explanation.cause and s.modes[1].measured_ratio < 1
    assert s.modes[0].comm_ms == pytest.approx(6.0) and s.criteria[0].judged
    text = render_summary(s)
    assert "why: all-to-all is 6%" in text and "what would change it" in text


def test_a_run_feeds_the_estimator(tmp_path):
    cal, note = calibration_from_pieces(StepPieces.model_validate(_pieces(probe_eff=1.7)), backend="nccl", world=2,
                                        precision="bf16", source="run")
    assert cal.overlap_efficiency == 1.0 and "clipped" in note
    assert cal.expert_tflops == pytest.approx(2e12 / 0.030 / 1e12)
    assert cal.a2a_gbps > 0 and cal.a2a_latency_us > 0
    report = {"format": "moe-overlap-verification-report", "config": {"precision": "bf16"},
              "environment": {"backend": "nccl", "nproc": 2}, "analysis": {"pieces": _pieces()}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    cal, cfg = calibration_from_run(tmp_path)
    assert cal.source.startswith("verification run") and cfg["precision"] == "bf16"
    (tmp_path / "report.json").write_text(json.dumps({**report, "analysis": None}))
    with pytest.raises(RunCalibrationError, match="no timed pieces"):
        calibration_from_run(tmp_path)
    with pytest.raises(RunCalibrationError, match="not a readable"):
        calibration_from_run(tmp_path / "missing")


@pytest.mark.parametrize("comm_s", [0.0, 0.0999, 0.2])
def test_degenerate_pieces_still_explain(comm_s):
    """All-to-alls timed alone longer than the whole baseline step (a noisy machine), or none at all."""
    runs = [_run("baseline", 0.100, jitter=0.3), _run("overlap", 0.100, jitter=0.3)]
    a, _ = _analysis(runs, _pieces(comm_s=comm_s))
    assert a.explanation is not None and a.explanation.cause
    assert a.modes[0].compute_s >= 0 and a.modes[1].exposed_comm_s >= 0


def test_a_gain_above_the_comm_ceiling_says_the_sequential_step_waited_on_more():
    # 10 ms of all-to-all in a 100 ms step bounds the overlap at x1.11; a measured x1.25 saved more than that.
    runs = [_run("baseline", 0.100), _run("overlap", 0.080)]
    a, tp = _analysis(runs, _pieces(comm_s=0.010, probe_eff=0.9))
    assert tp.status == "pass" and a.explanation.pays
    assert "more than the x1.11 of hiding all of it" in a.explanation.cause
    assert "at most" not in a.explanation.cause
