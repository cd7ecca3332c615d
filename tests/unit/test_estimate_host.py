"""The estimator's host floor (skill/estimate/host.py): host-bound layers gain nothing, GPU-bound ones are unchanged,
the factors are the committed measurements, and the anchors script reads a run's host time (torch-free)."""

from __future__ import annotations

import glob
import json
import statistics
from pathlib import Path

import pytest

from moe_overlap.cli import main
from moe_overlap.skill.estimate import host
from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.text import render_text

ROOT = Path(__file__).resolve().parents[2]
# Our Qwen3 layer at EP 2 on two H200s: small expert GEMMs, a fast link (the shape of the host-bound row).
# megatron_host=False: the host time is given explicitly here (or absent: no floor)
SMALL = dict(model="qwen3-30b-a3b", tokens=4096, ep=2, micro_batches=64, layers=1, fabric="h200-nvlink",
             gpu_preset="h200", megatron_host=False)


def est(**kw):
    return estimate_overlap_benefit(parse_request(kw))


def by_name(r):
    return {s.name: s for s in r.schedules}


def test_host_bound_layer_gains_nothing_and_says_so():
    gpu = by_name(est(**SMALL))
    assert gpu["1f1b"].speedup > 1.02  # the GPU timeline alone predicts a gain
    gpu_none_layer = gpu["none"].step_ms / 64
    r = est(**SMALL, host_ms=2.0 * gpu_none_layer)
    s = by_name(r)
    assert all(x.host_bound for x in r.schedules)
    assert s["none"].step_ms == pytest.approx(2.0 * gpu_none_layer * 64)
    assert s["1f1b"].speedup == pytest.approx(1 / host.HOST_FACTORS["sm"]["1f1b"])  # ~0.93x: the pair issues more
    assert s["1f1b+wgrad"].speedup == pytest.approx(1 / host.HOST_FACTORS["sm"]["1f1b+wgrad"])
    assert "chunked" not in s  # not predicted (docs/estimate.md, "chunked")
    assert r.recommendation != "use" and r.predicted_speedup <= 1.0
    assert any(x.startswith("host-bound: overlap cannot help") for x in r.reasons)
    text = render_text(r)
    assert "host-bound: overlap cannot help" in text and "(host-bound)" in text
    assert any(a.startswith("host floor:") for a in r.assumptions)


def test_gpu_bound_layer_is_unchanged_by_a_small_host_time():
    big = dict(SMALL, model="deepseek-v3")
    plain = est(**big)
    floored = est(**big, host_ms=0.2 * plain.schedules[0].step_ms / 64)
    assert [(s.name, s.step_ms, s.speedup) for s in floored.schedules] == \
        [(s.name, s.step_ms, s.speedup) for s in plain.schedules]
    assert not any(s.host_bound for s in floored.schedules)
    assert floored.recommendation == plain.recommendation
    assert not any("host-bound" in x for x in floored.reasons)
    assert any(a.startswith("no host floor") for a in plain.assumptions)


def test_floor_binds_per_schedule_between_the_two_regimes():
    """Host time just under the no-overlap GPU time: none stays GPU-bound, the overlapped pair hits the floor."""
    gpu = by_name(est(**SMALL))
    none_layer, pair_layer = gpu["none"].step_ms / 64, gpu["1f1b"].step_ms / 64
    h = 0.97 * none_layer
    assert h * host.HOST_FACTORS["sm"]["1f1b"] > pair_layer
    s = by_name(est(**SMALL, host_ms=h))
    assert not s["none"].host_bound and s["1f1b"].host_bound
    assert s["1f1b"].step_ms == pytest.approx(h * host.HOST_FACTORS["sm"]["1f1b"] * 64)


def test_calibration_host_time_is_used_and_the_request_wins():
    cal = {"expert_tflops": 600, "dense_tflops": 700, "a2a_gbps": 300, "a2a_latency_us": 15,
           "overlap_efficiency": 0.5, "host_ms": 50.0, "source": "test"}
    req = dict(hidden=2048, moe_ffn=768, experts=128, topk=8, tokens=4096, ep=2, micro_batches=8, calibration=cal)
    assert est(**req).hardware.host_ms == 50.0 and est(**req).schedules[0].host_bound
    assert est(**req, host_ms=0.001).hardware.host_ms == 0.001
    with pytest.raises(EstimateError) as exc:
        est(**req, host_ms=-1)
    assert exc.value.field == "host_ms"


def test_cli_host_ms(capsys):
    args = ["estimate", "--model", "qwen3-30b-a3b", "--tokens", "4096", "--ep", "2", "--micro-batches", "8",
            "--fabric", "h200-nvlink", "--gpu-preset", "h200"]
    assert main([*args, "--host-ms", "100", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["request"]["host_ms"] == 100 and all(s["host_bound"] for s in out["schedules"])
    assert main([*args, "--host-ms", "0", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "host_ms"


def _host_rows(files=None):
    for path in files or host.FACTOR_FILES:
        for p in json.loads((ROOT / path).read_text())["presets"]:
            yield {r["schedule"]: r["host_ms"] for r in p["rows"] if r.get("host_ms")}


def test_pair_factors_are_the_committed_runs():
    assert len(list(_host_rows())) == 9  # three runs x three shapes
    for engine, files in host.ENGINE_FILES.items():
        rows = list(_host_rows(files))
        assert len(rows) == 3 * len(files)
        for name in ("1f1b", "1f1b+wgrad"):
            assert round(statistics.mean(r[name] / r["none"] for r in rows), 3) == host.HOST_FACTORS[engine][name]


def test_copy_engine_factors_sit_below_the_nccl_ones_shape_by_shape():
    """Why the factors are per engine: in the r3 files every copy-engine pair factor is below both NCCL runs'
    at the same shape (the plain layer over copy engines already issues per-peer copies and events)."""
    by_shape = {}
    for engine, files in host.ENGINE_FILES.items():
        for path in files:
            for p in json.loads((ROOT / path).read_text())["presets"]:
                r = {x["schedule"]: x["host_ms"] for x in p["rows"] if x.get("host_ms")}
                by_shape.setdefault(p["preset"], {}).setdefault(engine, []).append(r["1f1b"] / r["none"])
    assert len(by_shape) == 3
    for engines in by_shape.values():
        assert max(engines["copy-engine"]) < min(engines["sm"])


def test_the_engine_picks_its_factors():
    gpu = by_name(est(**SMALL))
    h = 2.0 * gpu["none"].step_ms / 64
    for engine in ("sm", "copy-engine"):
        s = by_name(est(**SMALL, host_ms=h, a2a_engine=engine))
        assert s["1f1b"].speedup == pytest.approx(1 / host.HOST_FACTORS[engine]["1f1b"])


def test_chunk_share_is_the_committed_runs():
    shares = [(r[f"chunked:{c}"] / r["none"] - 1) / (c - 1) for r in _host_rows() for c in (2, 4)]
    assert len(shares) == 18
    assert round(statistics.median(shares), 2) == host.CHUNK_HOST_SHARE


@pytest.fixture()
def anchors():
    from benchmarks.estimator import estimate_anchors

    return estimate_anchors


def test_anchors_read_a_runs_host_time(anchors, tmp_path):
    src = ROOT / "benchmarks" / "results" / "h200x2_2026-11-29" / "ep_overlap_cuda_r2.json"
    data = json.loads(src.read_text())
    data["presets"] = [p for p in data["presets"] if p["preset"] == "qwen3-30b-a3b"]
    none = next(r for r in data["presets"][0]["rows"] if r["schedule"] == "none")
    path = tmp_path / "ep_overlap_cuda_r2.json"
    path.write_text(json.dumps(data))
    monkey_root = anchors.ROOT
    anchors.ROOT = tmp_path  # labels are relative to ROOT
    try:
        (row_without,) = [r for r in anchors.our_rows([str(path)]) if "speedup" in r["quantity"]]
        assert row_without.get("host_ms") is None and not row_without["host_bound"]  # another folder: no profile
        none["host_ms"] = none["total_ms"] * 0.98
        path.write_text(json.dumps(data))
        (row,) = [r for r in anchors.our_rows([str(path)]) if "speedup" in r["quantity"]]
    finally:
        anchors.ROOT = monkey_root
    assert row["host_ms"] == pytest.approx(none["total_ms"] * 0.98) and "host_ms" in row["host_source"]
    assert row["host_bound"] and row["predicted_calibrated"] < row_without["predicted_calibrated"]


def test_anchors_gemm_rate_is_the_named_file(anchors, tmp_path):
    rate, label = anchors.gemm_rate(anchors.GEMM_RATE_FILE)
    assert label == anchors.GEMM_RATE_FILE and 100 < rate < 2000
    cal = next(r for r in anchors.anchor_rows() if r["what"].startswith("DeepSeek-V3 proxy"))
    bare = next(r for r in anchors.anchor_rows(None, None) if r["what"].startswith("DeepSeek-V3 proxy"))
    assert cal["predicted_calibrated"] < cal["predicted"] and bare["predicted_calibrated"] is None
    assert anchors.GEMM_RATE_FILE in cal["source"]
    cpu = tmp_path / "cpu.json"
    cpu.write_text(json.dumps({"device": "cpu", "shapes": {anchors.GEMM_SHAPE: {"tflops": 0.01}}}))
    for bad in (cpu, tmp_path / "missing.json"):
        with pytest.raises(anchors.InputError, match="--gemm-rate"):
            anchors.gemm_rate(str(bad))


def test_every_committed_two_gpu_run_is_within_the_goal(anchors):
    files = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "**" / "ep_overlap_cuda_r*.json"), recursive=True))
    rows = [r for r in anchors.our_rows(files) if "speedup" in r["quantity"]]
    assert len(rows) >= 15
    assert [r["what"] for r in rows if abs(r["error_calibrated"]) >= 0.20] == []
    recorded = [r for r in rows if "_r3" in r["what"]]  # runs whose rows carry host_ms use it, not a profile
    assert recorded and all(r["host_source"] == "the run's no-overlap row (host_ms)" for r in recorded)
    assert any(r["host_bound"] for r in recorded)  # the repeat run's Qwen3 layer
