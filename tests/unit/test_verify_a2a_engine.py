"""verify's estimator prediction takes the all-to-all engine the overlap modes used: copy engines (`--a2a ce`,
or auto that found one host with peer access) get the estimator's copy-engine host factors, everything else
its SM-driven ones (skill/estimate/host.py HOST_FACTORS); the run's own probe efficiency stays either way."""

from __future__ import annotations

import pytest

from moe_overlap.skill.estimate.host import HOST_FACTORS
from moe_overlap.verify.judge.criteria import criterion_throughput
from moe_overlap.verify.judge.explain import a2a_engine, build_analysis
from tests.unit.test_verify_host import CFG, HOST_BOUND_MS, LAYER_STEPS, _pieces, _run

NCCL = "nccl (the process group's own)"  # the notes verify/run/worker.py writes (benchmarks/results/ hold them)
CE_AUTO = "auto: copy engines (all ranks on one host with peer access)"
CE_ASKED = "ce: copy engines (all ranks on one host with peer access)"
RUNS = [_run("baseline", 0.100, 0.097), _run("overlap", 0.101, 0.099), _run("overlap+wgrad", 0.101, 0.099)]


def _prediction(transport: str, host_ms=HOST_BOUND_MS, device="cuda"):
    a = build_analysis(CFG, nproc=2, device=device, backend="nccl" if device == "cuda" else "gloo",
                       fabric="native", transport=transport, runs=RUNS,
                       throughput=criterion_throughput(RUNS, device, device == "cuda"),
                       pieces_record=_pieces(host_ms, probe_eff=0.6),
                       schedules={"baseline": "none", "overlap": "1f1b", "overlap+wgrad": "1f1b"})
    return a


@pytest.mark.parametrize("device,transport,engine", [
    ("cuda", CE_AUTO, "copy-engine"), ("cuda", CE_ASKED, "copy-engine"),
    ("cuda", NCCL, "sm"), ("cuda", "auto: NCCL (ranks span 2 hosts)", "sm"), ("cuda", "nccl: NCCL (asked)", "sm"),
    ("cuda", "nccl (sync-free: equal-block all-to-alls)", "sm"), ("cuda", "", "sm"),
    ("cpu", "gloo (CPU ranks: the process group's own)", "sm"),
    ("cpu", "auto: fake ce (gloo + 5 ms per call; a test's)", "sm"),  # a test's gloo fake: no copy engine
])
def test_the_engine_follows_what_the_overlap_modes_ran(device, transport, engine):
    assert a2a_engine(device, transport) == engine


@pytest.mark.parametrize("transport", [CE_AUTO, CE_ASKED])
def test_copy_engines_get_the_copy_engine_host_factors(transport):
    a = _prediction(transport)
    pr = a.prediction
    assert pr.request["a2a_engine"] == "copy-engine"
    assert {"1f1b", "1f1b+wgrad"} <= set(pr.host_bound)
    # Host-bound: each overlap schedule's step is the host's issue time x the engine's factor, + the optimizer.
    for name in ("1f1b", "1f1b+wgrad"):
        host = HOST_BOUND_MS * HOST_FACTORS["copy-engine"][name] * LAYER_STEPS / 1e3
        assert pr.step_s[name] == pytest.approx(host + 0.001, rel=1e-3)
    f = HOST_FACTORS["copy-engine"]["1f1b"]
    assert f"x{f:.3f}" in pr.host_note and f"x{HOST_FACTORS['sm']['1f1b']:.3f}" not in pr.host_note
    # The probe measured with those copy engines stays the efficiency, not the estimator's copy-engine default.
    assert pr.request["overlap_efficiency"] == 0.6 == pr.overlap_efficiency


def test_nccl_keeps_the_default_engine():
    pr = _prediction(NCCL).prediction
    assert "a2a_engine" not in pr.request and "overlap_efficiency" not in pr.request
    for name in ("1f1b", "1f1b+wgrad"):
        host = HOST_BOUND_MS * HOST_FACTORS["sm"][name] * LAYER_STEPS / 1e3
        assert pr.step_s[name] == pytest.approx(host + 0.001, rel=1e-3)
    ce = _prediction(CE_AUTO)
    # fewer host ops per pair over copy engines: a better predicted ratio for the same measured host time
    assert all(c.predicted_ratio > n.predicted_ratio for c, n in zip(ce.modes[1:], _prediction(NCCL).modes[1:],
                                                                      strict=True))


def test_without_a_host_floor_the_engine_changes_nothing():
    """GPU-bound: the host factors do not apply and the efficiency is the probe's on both engines."""
    ce, nccl = _prediction(CE_AUTO, host_ms=None).prediction, _prediction(NCCL, host_ms=None).prediction
    assert ce.request["a2a_engine"] == "copy-engine" and not ce.host_bound and not nccl.host_bound
    assert ce.step_s == pytest.approx(nccl.step_s)


def test_a_cpu_fake_ce_run_stays_sm():
    pr = _prediction("auto: fake ce (gloo + 5 ms per call; a test's)", device="cpu").prediction
    assert pr.available and "a2a_engine" not in pr.request


@pytest.mark.parametrize("note,margin", [
    ("8 (auto: NCCL over a network link holds a few SMs beside the GEMMs)", 8), ("16 (asked)", 16),
    ("0 (auto: no SM-driven all-to-all here)", 0), (None, 0), ("", 0), ("auto", 0),
])
def test_the_runs_sm_margin_is_read_from_its_note(note, margin):
    from moe_overlap.verify.judge.explain import margin_of

    assert margin_of(note) == margin


def test_a_run_with_an_sm_margin_is_predicted_with_it():
    kw = dict(nproc=2, device="cuda", backend="nccl", fabric="emulated-net", transport=NCCL, runs=RUNS,
              throughput=criterion_throughput(RUNS, "cuda", True), pieces_record=_pieces(probe_eff=0.6),
              schedules={"baseline": "none", "overlap": "1f1b", "overlap+wgrad": "1f1b"})
    plain = build_analysis(CFG, **kw).prediction
    margin = build_analysis(CFG, **kw, sm_margin=8).prediction
    assert "sm_margin" not in plain.request and margin.request["sm_margin"] == 8
    assert margin.step_s["none"] == pytest.approx(plain.step_s["none"])  # none never sets the margin
    assert margin.step_s["1f1b"] != pytest.approx(plain.step_s["1f1b"])
