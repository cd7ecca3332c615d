"""estimate_overlap_benefit: bad inputs, exact counts, schedule properties, recommendation, CLI (no torch)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_overlap.cli import main
from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.model import Calibration, EstimateRequest
from moe_overlap.skill.estimate.timeline import NodeTimes, blend, layer_timeline, one_f_one_b_timeline

# megatron_host=False: these tests check the GPU timelines; the host floor has its own tests
# (test_estimate_host.py, test_estimate_accuracy.py)
BASE = dict(hidden=1024, moe_ffn=512, experts=16, topk=4, tokens=2048, ep=8, micro_batches=4, layers=2,
            fabric="h100-nvlink+ib-400g", gpu_preset="h200", megatron_host=False)


def est(**kw):
    return estimate_overlap_benefit(parse_request({**BASE, **kw}))


def by_name(result):
    return {s.name: s for s in result.schedules}


# ------------------------------------------------------------------ bad inputs name their field
@pytest.mark.parametrize("field", ["hidden", "moe_ffn", "experts", "topk", "tokens", "ep", "micro_batches"])
@pytest.mark.parametrize("value", [0, -3])
def test_non_positive_sizes_name_the_field(field, value):
    with pytest.raises(EstimateError) as err:
        parse_request({**BASE, field: value})
    assert err.value.field == field
    assert field in str(err.value)


@pytest.mark.parametrize("kw, field", [
    (dict(topk=17), "topk"),
    (dict(ep=3), "ep"),
    (dict(ep=16, gpus_per_node=6), "gpus_per_node"),
    (dict(fabric="h100-nvlink+ethernet"), "fabric"),
    (dict(fabric="h100-nvlink+b200-nvlink"), "fabric"),
    (dict(gpu_preset="a100"), "gpu_preset"),
    (dict(ep=16, fabric="h100-nvlink"), "fabric"),  # spans 2 nodes, no inter-node link given
    (dict(fabric=None, gpu_preset=None, tflops=500.0), "fabric"),  # no GPU preset to take the fabric from
    (dict(gpu_preset=None), "gpu_preset"),
    (dict(precision="fp8"), "precision"),
    (dict(precision="fp32"), "precision"),  # presets are bf16 measurements
    (dict(intra_gbps=-1), "intra_gbps"),
    (dict(intra_gbps=float("inf")), "intra_gbps"),  # JSON output would carry an invalid Infinity
    (dict(attn_ms=float("nan")), "attn_ms"),
    (dict(unknown_knob=1), "unknown_knob"),
])
def test_bad_inputs_name_the_field(kw, field):
    with pytest.raises(EstimateError) as err:
        est(**kw)
    assert err.value.field == field


def test_unknown_preset_lists_choices():
    with pytest.raises(EstimateError) as err:
        est(fabric="nvlink9")
    assert "h100-nvlink" in err.value.choices and "ib-400g" in err.value.choices


def test_direct_model_call_is_checked_too():
    req = EstimateRequest(**{**BASE, "topk": 99})
    with pytest.raises(EstimateError, match="topk"):
        estimate_overlap_benefit(req)


# ------------------------------------------------------------------ exact counts
def test_expert_flops_count_w1_and_w2_exactly():
    r = est()
    routed = 2048 * 4
    # w1 [D, 2F]: 2*D*2F per row; w2 [F, D]: 2*F*D per row.
    assert r.per_layer.expert_gflop_fwd == pytest.approx((2 * 1024 * 2 * 512 + 2 * 512 * 1024) * routed / 1e9)
    assert r.per_layer.expert_gflop_dgrad == r.per_layer.expert_gflop_wgrad == r.per_layer.expert_gflop_fwd


@pytest.mark.parametrize("ep, gpn, intra_share, inter_share", [
    (8, 8, 7 / 8, 0.0), (16, 8, 7 / 16, 8 / 16), (32, 8, 7 / 32, 24 / 32), (4, 8, 3 / 4, 0.0),
])
def test_bytes_split_by_node(ep, gpn, intra_share, inter_share):
    r = est(ep=ep, experts=32, gpus_per_node=gpn, precision="fp16")
    sent = 2048 * 4 * 1024 * 2
    assert r.per_layer.a2a_intra_bytes == int(sent * intra_share)
    assert r.per_layer.a2a_inter_bytes == int(sent * inter_share)
    assert r.per_layer.a2a_bytes == int(sent * (ep - 1) / ep)


def test_link_time_uses_the_slower_level():
    r = est(ep=16, experts=32, fabric=None, intra_gbps=400, inter_gbps=50, a2a_efficiency=1.0)
    p = r.per_layer
    assert p.a2a_ms == pytest.approx(max(p.a2a_intra_bytes / 400e9, p.a2a_inter_bytes / 50e9) * 1e3)


def test_explicit_rates_override_presets():
    r = est(tflops=100.0, intra_gbps=10.0)
    assert r.hardware.expert_tflops == 100.0
    assert r.hardware.intra_gbps == pytest.approx(10.0 * r.hardware.a2a_efficiency)


def test_calibration_feeds_the_rates():
    cal = Calibration(expert_tflops=0.03, dense_tflops=0.04, mem_gbps=5, a2a_gbps=0.3, a2a_latency_us=800,
                      overlap_efficiency=0.4, source="test")
    r = estimate_overlap_benefit(parse_request(dict(hidden=256, moe_ffn=256, experts=8, topk=2, tokens=512, ep=2,
                                                    precision="fp32", calibration=cal.model_dump())))
    h = r.hardware
    assert (h.expert_tflops, h.intra_gbps, h.overlap_efficiency, h.intra_latency_us) == (0.03, 0.3, 0.4, 800)
    assert any("calibration" in s for s in h.sources)


def test_presets_win_over_calibration_efficiency_included():
    cal = Calibration(expert_tflops=0.03, dense_tflops=0.04, mem_gbps=5, perm_ns_per_elem=9, act_ns_per_elem=9,
                      wgrad_ns_per_weight=9, a2a_gbps=0.3, a2a_latency_us=800, overlap_efficiency=0.4,
                      source="test")
    r = est(calibration=cal.model_dump())  # BASE has fabric and gpu presets
    h = r.hardware
    assert h.intra_gbps == pytest.approx(450 * 0.75) and h.intra_latency_us == 15.0
    assert h.expert_tflops == 642.6 and h.perm_ns_per_elem is None and h.act_ns_per_elem is None
    # The fabric names the target machine: its link's efficiency, not the calibrated machine's.
    from moe_overlap.skill.estimate.hardware import NVLINK_OVERLAP_EFFICIENCY

    assert h.overlap_efficiency == NVLINK_OVERLAP_EFFICIENCY and h.efficiency_source.startswith("h100-nvlink preset")
    assert est(calibration=cal.model_dump(), fabric=None, intra_gbps=300.0).hardware.overlap_efficiency == 0.4


# ------------------------------------------------------------------ schedule properties
def test_none_exposes_all_communication():
    s = by_name(est())["none"]
    assert s.exposed_comm_ms == pytest.approx(s.comm_ms)
    assert s.step_ms == pytest.approx(s.compute_ms + s.comm_ms)


def test_no_overlap_efficiency_means_no_gain_for_1f1b():
    s = by_name(est(overlap_efficiency=0.0))
    assert s["1f1b"].step_ms == pytest.approx(s["none"].step_ms)
    # delayed wgrad only adds its GPU cost (costs.DELAYED_WGRAD_COST x the wgrad pass, per paired micro-batch)
    assert s["1f1b+wgrad"].step_ms > s["none"].step_ms
    assert s["1f1b+wgrad"].compute_ms - s["1f1b"].compute_ms == pytest.approx(
        s["1f1b+wgrad"].step_ms - s["none"].step_ms)


def test_single_micro_batch_has_no_1f1b():
    r = est(micro_batches=1)
    s = by_name(r)
    assert not s["1f1b"].available and s["1f1b"].step_ms == pytest.approx(s["none"].step_ms)
    # chunked is not predicted (measured 0.39-0.99x of none over NVLink, 1.10-1.22x over a network link)
    assert r.recommended_schedule == "none" and r.recommendation == "avoid"
    assert "chunked" not in s
    assert any("single-micro-batch" in x for x in r.reasons)
    assert any("chunked schedule is not predicted" in x for x in r.reasons)


@pytest.mark.parametrize("comm, comp, chunks, fwd", [
    (1.0, 4.0, 4, 4.0 + 2 * 1.0 / 4),  # compute-bound: first dispatch chunk and last combine chunk exposed
    (1.0, 4.0, 2, 4.0 + 2 * 1.0 / 2),
    (4.0, 1.0, 4, 2 * 4.0),  # comm-bound: the link never idles after the first chunk, the last expert
    (2.0, 2.0, 8, 2 * 2.0),  # chunk hides behind the previous combine (order d0 d1 c0 d2 c1 ... c7)
])
def test_chunked_pipeline_fill_and_drain(comm, comp, chunks, fwd):
    n = NodeTimes(0, comp, 0, 0, 0, 0, 0, 0, comm, 0, 0)
    tl = layer_timeline(n, chunks, chunk_backward=False)
    assert tl.makespan == pytest.approx(fwd + 2 * comm)  # backward unchunked: nothing to overlap there
    assert layer_timeline(n, 1).makespan == pytest.approx(comp + 4 * comm)


def test_blend_interpolates():
    n = NodeTimes(0.1, 1, 0.1, 0.1, 1, 1, 0.05, 0.2, 2, 0.01, 0.01)
    tl = one_f_one_b_timeline(n, layers=2, micro_batches=3, delay_wgrad=True)
    assert blend(tl, 0.0) == pytest.approx(tl.serial)
    assert blend(tl, 1.0) == pytest.approx(tl.makespan)
    assert tl.makespan <= tl.serial


durations = st.floats(0.0, 5.0, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(durations, min_size=11, max_size=11), st.integers(1, 3), st.integers(1, 4), st.integers(1, 6))
def test_timeline_bounds(d, layers, mbs, chunks):
    n = NodeTimes(*d)
    for tl in (layer_timeline(n, chunks), one_f_one_b_timeline(n, layers, mbs, False),
               one_f_one_b_timeline(n, layers, mbs, True)):
        assert max(tl.busy.values()) - 1e-9 <= tl.makespan <= tl.serial + 1e-9
    # Delayed wgrad only removes a dependency: it can never make 1f1b slower.
    assert (one_f_one_b_timeline(n, layers, mbs, True).makespan
            <= one_f_one_b_timeline(n, layers, mbs, False).makespan + 1e-9)


shapes = st.fixed_dictionaries(dict(
    hidden=st.integers(64, 8192), moe_ffn=st.integers(64, 8192), experts=st.sampled_from([8, 16, 64, 128]),
    topk=st.integers(1, 8), tokens=st.integers(128, 16384), ep=st.sampled_from([2, 4, 8]),
    micro_batches=st.integers(1, 8), gpus_per_node=st.just(8), megatron_host=st.just(False),
))


@settings(max_examples=40, deadline=None)
@given(shapes, st.floats(1.0, 4.0), st.floats(0.0, 1.0))
def test_monotone_in_bandwidth_and_overlap(shape, factor, eff):
    base = dict(shape, intra_gbps=100.0, tflops=400.0, overlap_efficiency=eff)
    slow = by_name(estimate_overlap_benefit(parse_request(base)))
    fast = by_name(estimate_overlap_benefit(parse_request({**base, "intra_gbps": 100.0 * factor})))
    for name in slow:  # more bandwidth never makes a step slower
        assert fast[name].step_ms <= slow[name].step_ms * (1 + 1e-9)
    better = by_name(estimate_overlap_benefit(parse_request({**base, "overlap_efficiency": min(1.0, eff + 0.3)})))
    for name in slow:  # better overlap never makes a step slower
        assert better[name].step_ms <= slow[name].step_ms * (1 + 1e-9)
    assert fast["none"].speedup == 1.0 and slow["1f1b"].speedup >= 1.0 - 1e-9


@settings(max_examples=30, deadline=None)
@given(shapes, st.integers(1, 4))
def test_more_tokens_cost_more(shape, k):
    base = dict(shape, intra_gbps=100.0, tflops=400.0)
    a = by_name(estimate_overlap_benefit(parse_request(base)))["none"]
    b = by_name(estimate_overlap_benefit(parse_request({**base, "tokens": shape["tokens"] * (k + 1)})))["none"]
    assert b.step_ms > a.step_ms and b.comm_ms > a.comm_ms


# ------------------------------------------------------------------ recommendation
def test_recommendation_words():
    assert est(ep=16, experts=32).recommendation == "use"  # half the traffic on 50 GB/s IB
    # the band of a small EP-4 job on one NVLink node includes a slowdown: never "use"
    assert est(ep=4, experts=32, megatron_host=True, micro_batches=8).recommendation in ("measure first", "avoid")
    light = est(fabric=None, intra_gbps=1e6, ep=2, hidden=4096, moe_ffn=2048, tokens=16384)
    assert light.recommendation == "gain likely negligible" and light.comm_share < 0.05
    r = est(ep=1)
    assert r.recommendation == "avoid" and any("ep-size-gt-1" in x for x in r.reasons)


def test_every_assumption_is_stated():
    text = " ".join(est().assumptions)
    for word in ("balanced routing", "6*D*F", "latency", "overlap efficiency", "1f1b", "not modelled"):
        assert word in text


# ------------------------------------------------------------------ CLI and import hygiene
ARGS = ["estimate", "--hidden", "1024", "--moe-ffn", "512", "--experts", "16", "--topk", "4", "--tokens", "2048",
        "--ep", "8", "--micro-batches", "4", "--fabric", "h200-nvlink", "--gpu-preset", "h200"]


def test_cli_json(capsys):
    assert main(ARGS + ["--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["recommendation"] in ("use", "measure first", "gain likely negligible", "avoid")
    assert [s["name"] for s in out["schedules"]] == ["none", "1f1b", "1f1b+wgrad"]


def test_cli_text(capsys):
    assert main(ARGS) == 0
    out = capsys.readouterr().out
    assert "recommendation:" in out and "assumptions:" in out


def test_cli_bad_input_exit_2(capsys):
    assert main(ARGS[:-2] + ["--gpu-preset", "tpu", "--format", "json"]) == 2
    err = json.loads(capsys.readouterr().out)
    assert err["field"] == "gpu_preset" and "h200" in err["choices"]


def test_estimator_does_not_import_torch():
    code = ("import sys; import moe_overlap.skill.estimate.api, moe_overlap.commands.estimate, "
            "moe_overlap.verify.calibrate.machine; sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_chunked_backward_pays_the_weight_gradient_write_per_chunk():
    n = NodeTimes(0, 1.0, 0, 0, 1.0, 1.0, 0.5, 0, 0.0, 0, 0)
    assert layer_timeline(n, 4).serial == pytest.approx(layer_timeline(n, 1).serial + 3 * 0.5)


# ------------------------------------------------------------------ calibration maths (torch-free parts)
def test_fit_nonnegative_recovers_and_clips():
    from moe_overlap.verify.calibrate.machine import fit_nonnegative

    feats = [[1.0, x, x * x] for x in (1.0, 2.0, 3.0, 5.0, 8.0)]
    coef = fit_nonnegative(feats, [2 + 3 * x + 0.5 * x * x for _, x, _ in feats])
    assert coef == pytest.approx([2, 3, 0.5], rel=1e-6)
    clipped = fit_nonnegative(feats, [2 + 3 * x - 0.01 * x * x for _, x, _ in feats])
    assert min(clipped) >= 0 and clipped[2] == 0


def test_calibration_from_synthetic_probes():
    from moe_overlap.verify.calibrate.machine import A2A_BYTES, LOCAL_SHAPES, calibration_from

    rate, c_d, c_f, c_w, fixed, dense = 50e9, 2e-9, 3e-9, 1e-9, 1e-3, 40e9
    lat, bw = 5e-4, 1e9
    sizes = {"rows": 1024, "d": 512, "mm_n": 512, "esize": 4, "mm_iters": 3,
             "a2a_off_rank_bytes": [b / 2 for b in A2A_BYTES]}
    times = {"dense": 2 * 512**3 / dense, "gather": 2 * 1024 * 2 * 512 * 4 / 2e9}
    for i, (t, d, f, e, k) in enumerate(LOCAL_SHAPES):
        r = t * k
        times[f"local_{i}"] = (fixed + 18 * d * f * r / rate + r * d * c_d + r * f * c_f + 3 * e * d * f * c_w
                               + 6 * t * d * e / dense)
    for j, b in enumerate(sizes["a2a_off_rank_bytes"]):
        times[f"a2a_{j}"] = lat + b / bw
    big = times[f"a2a_{len(A2A_BYTES) - 1}"]
    times["mm_loop"], times["both"] = 1.2 * big, 1.2 * big + 0.3 * big  # 70% of the a2a hidden
    # Two ranks, three rounds; rank 1 is 10% slower in round 1 only: the median ignores it.
    slow = {k: v * 1.1 for k, v in times.items()}
    per_rank = [{"sizes": sizes, "rounds": [times, times, times]},
                {"sizes": sizes, "rounds": [times, slow, times]}]
    cal = calibration_from(per_rank, backend="gloo", precision="fp32")
    assert cal.expert_tflops == pytest.approx(rate / 1e12, rel=1e-3)
    assert cal.perm_ns_per_elem == pytest.approx(c_d * 1e9, rel=1e-3)
    assert cal.act_ns_per_elem == pytest.approx(c_f * 1e9, rel=1e-3)
    assert cal.wgrad_ns_per_weight == pytest.approx(c_w * 1e9, rel=1e-3)
    assert cal.overhead_ms == pytest.approx(fixed * 1e3, rel=1e-3)
    assert cal.a2a_gbps == pytest.approx(bw / 1e9, rel=1e-3)
    assert cal.a2a_latency_us == pytest.approx(lat * 1e6, rel=1e-3)
    assert cal.overlap_efficiency == pytest.approx(0.7, rel=1e-6)


def test_cli_link_gbps_sets_both_levels(capsys):
    args = ARGS[:-4] + ["--ep", "16", "--experts", "32", "--link-gbps", "100", "--gpu-preset", "h200",
                        "--format", "json"]
    assert main(args) == 0
    hw = json.loads(capsys.readouterr().out)["hardware"]
    assert hw["intra_gbps"] == hw["inter_gbps"] == pytest.approx(75.0)


def test_cli_nccl_calibration_without_gpus_is_bad_input(capsys, monkeypatch):
    from moe_overlap.verify.calibrate import machine as calibrate

    monkeypatch.setattr(calibrate, "_cuda_available", lambda world: False)
    monkeypatch.setattr(calibrate, "run_ranks", lambda *a, **k: pytest.fail("no rank may start"))
    assert main(ARGS + ["--calibrate", "--calibrate-backend", "nccl"]) == 2
    err = capsys.readouterr().err
    assert "--calibrate-backend" in err and "gloo" in err and "Traceback" not in err
    assert main(ARGS + ["--calibrate-backend", "gloo"]) == 2  # silently ignored before
    assert "add --calibrate" in capsys.readouterr().err
