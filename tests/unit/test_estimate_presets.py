"""The estimator fed by measurement: model presets from public configs, GEMM rates from the committed H200 results,
overlap efficiency per link kind, a finished verification run as calibration, and the anchors (torch-free)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_overlap.cli import main
from moe_overlap.skill.estimate import hardware as hw
from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.models import MODELS, model_preset
from tests.verify_report import write_run

ROOT = Path(__file__).resolve().parents[2]


def est(**kw):
    return estimate_overlap_benefit(parse_request(kw))


def test_model_preset_fills_the_shape_and_explicit_values_win():
    r = est(model="qwen3-30b-a3b", tokens=4096, ep=16, fabric="h100-nvlink+ib-400g", gpu_preset="h100")
    q = r.request
    assert (q.hidden, q.moe_ffn, q.experts, q.topk, q.layers) == (2048, 768, 128, 8, 48)
    assert any("huggingface.co/Qwen/Qwen3-30B-A3B" in a for a in r.assumptions)
    mine = est(model="qwen3-30b-a3b", tokens=4096, ep=8, experts=64, layers=2, fabric="h100-nvlink",
               gpu_preset="h100").request
    assert (mine.experts, mine.layers, mine.hidden) == (64, 2, 2048)
    for p in MODELS.values():
        assert p.source and p.experts % 8 == 0 and p.topk <= p.experts


def test_missing_shape_or_unknown_model_names_the_field():
    with pytest.raises(EstimateError) as err:
        parse_request({"tokens": 4096, "ep": 8, "moe_ffn": 768, "experts": 128, "topk": 8})
    assert err.value.field == "hidden" and "qwen3-30b-a3b" in err.value.choices
    with pytest.raises(EstimateError) as err:
        parse_request({"model": "gpt-5", "tokens": 4096, "ep": 8})
    assert err.value.field == "model" and "deepseek-v3" in str(err.value)


def test_attention_time_from_the_model_shape():
    # Qwen3-30B-A3B at sequence 4096: projections 2*T*18.9M + causal core 2*T*(S+1)/2*32*256 = 292 GFLOP.
    assert model_preset("qwen3-30b-a3b").attn_fwd_flops(4096, 4096) == pytest.approx(292.1e9, rel=1e-3)
    r = est(model="qwen3-30b-a3b", tokens=4096, ep=16, fabric="h100-nvlink+ib-400g", gpu_preset="h100")
    assert r.per_layer.attn_fwd_ms == pytest.approx(292.1e9 / 803.9e12 * 1e3, rel=1e-3)
    given = est(model="qwen3-30b-a3b", tokens=4096, ep=16, fabric="h100-nvlink+ib-400g", gpu_preset="h100",
                attn_ms=1.0)
    assert given.per_layer.attn_fwd_ms == 1.0
    assert est(hidden=64, moe_ffn=64, experts=8, topk=2, tokens=64, ep=2, tflops=1.0, intra_gbps=1.0
               ).per_layer.attn_fwd_ms == 0.0


def test_h200_rates_are_the_committed_forward_backward_measurement():
    data = json.loads((ROOT / "benchmarks/results/gpu_layer.json").read_text())
    raw = {m: data["shapes"][m]["experts"]["raw_grouped_mm"]["tflops"] for m in ("qwen3-30b-a3b", "deepseek-v3")}
    h200 = hw.gpu_preset("h200")
    assert h200.expert_tflops_for("qwen3-30b-a3b") == raw["qwen3-30b-a3b"]
    assert h200.expert_tflops_for("deepseek-v3") == raw["deepseek-v3"]
    assert h200.expert_tflops_for(None) == min(raw.values())  # other shapes: the lower one
    assert h200.dense_tflops == data["ceilings"]["matmul_bf16_tflops"]
    assert h200.mem_gbps == data["ceilings"]["copy_GBps"]
    assert "benchmarks/results/gpu_layer.json" in h200.source and "490" not in h200.source
    r = est(model="qwen3-30b-a3b", tokens=4096, ep=8, fabric="h200-nvlink", gpu_preset="h200")
    assert r.hardware.expert_tflops == raw["qwen3-30b-a3b"]


def test_overlap_efficiency_per_link_kind():
    one_node = est(model="deepseek-v3", tokens=4096, ep=8, fabric="h200-nvlink", gpu_preset="h200").hardware
    assert one_node.overlap_efficiency == hw.NVLINK_OVERLAP_EFFICIENCY
    assert hw.EFFICIENCY_FILES[0] in one_node.efficiency_source
    two_nodes = est(model="deepseek-v3", tokens=4096, ep=16, fabric="h200-nvlink+ib-400g", gpu_preset="h200")
    assert two_nodes.hardware.overlap_efficiency == hw.NETWORK_OVERLAP_EFFICIENCY
    assert est(model="deepseek-v3", tokens=4096, ep=8, fabric="h200-nvlink", gpu_preset="h200",
               overlap_efficiency=0.3).hardware.efficiency_source == "given"
    bare = est(hidden=64, moe_ffn=64, experts=8, topk=2, tokens=64, ep=2, tflops=1.0, intra_gbps=1.0)
    assert bare.hardware.overlap_efficiency == 1.0 and any("upper bound" in x for x in bare.reasons)


def test_the_anchors_and_our_runs():
    """docs/estimate.md's table (python benchmarks/estimator/estimate_anchors.py): the errors it states."""
    import glob

    from benchmarks.estimator import estimate_anchors as ea

    files = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "h200x2_2026-11-29" / "ep_overlap_cuda_r2*.json")))
    rows = {(r["what"], r["quantity"]): r for r in ea.anchor_rows() + ea.our_rows(files)}
    q = "Qwen3-30B-A3B, 16xH100 EP16"
    assert abs(rows[(q, "speedup 1f1b")]["error"]) < 0.10  # presets alone
    for name in ("none", "1f1b", "1f1b+wgrad"):  # calibrated on the measured no-overlap step: the 20% goal
        assert abs(rows[(q, f"step s, {name}")]["error_calibrated"]) < 0.20
    proxy = rows[("DeepSeek-V3 proxy layer, 8xH100 EP8", "fwd+bwd ms, no overlap")]
    assert 0.15 < proxy["error"] < 0.30  # +23%: stated, not tuned away (docs/estimate.md says why)
    # Calibrated with the H200 GEMM rate and memory-bound shares of HBM peak at the anchor's per-rank shape, the
    # all-to-alls from presets: +19%, at the edge of the goal; docs/estimate.md says where the miss is.
    assert proxy["predicted_calibrated"] < proxy["predicted"] and ea.GEMM_RATE_FILE in proxy["source"]
    assert ea.MEM_RATE_FILE in proxy["source"]
    assert 0.10 < proxy["error_calibrated"] < 0.25
    ours = [r for r in rows.values() if r["what"].startswith("ours") and "speedup" in r["quantity"]]
    assert len(ours) == 6  # three shapes x (NCCL, copy engines) on NVLink; the emulated run has its own shape
    # All within the 20% goal: the host-bound Qwen3 layer with NCCL through the host floor (its session's profile).
    misses = [r["what"] for r in ours if abs(r["error_calibrated"]) >= 0.20]
    assert misses == [], misses
    run = "h200x2_2026-11-29"  # the run each row comes from ends its label
    assert all(r["what"].endswith(run) for r in ours)
    qwen = rows[(f"ours, qwen3-30b-a3b, EP 2, native, nccl, {run}", "speedup 1f1b (calibrated on the run's pieces)")]
    assert qwen["host_bound"] and qwen["predicted_calibrated"] < 1.0 < qwen["predicted"]
    proxy2 = rows[(f"ours, dsv3-proxy, EP 2, native, nccl, {run}", "speedup 1f1b (calibrated on the run's pieces)")]
    assert proxy2["host_ms"] and not proxy2["host_bound"]  # GPU-bound: the floor is there and does not bind


def test_cli_model_preset_and_from_run(tmp_path, capsys):
    assert main(["estimate", "--model", "deepseek-v3", "--tokens", "4096", "--ep", "16", "--micro-batches", "8",
                 "--fabric", "h200-nvlink+ib-400g", "--gpu-preset", "h200", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["request"]["hidden"] == 7168 and out["hardware"]["overlap_efficiency"] == hw.NETWORK_OVERLAP_EFFICIENCY
    assert main(["estimate", "--tokens", "4096", "--ep", "16", "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "hidden"
    write_run(tmp_path)
    assert main(["estimate", "--model", "qwen3-30b-a3b", "--tokens", "4096", "--ep", "2", "--from-run",
                 str(tmp_path), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["overlap_efficiency"] == 0.5
    assert any("verification run" in s for s in out["hardware"]["sources"])
    assert main(["estimate", "--model", "qwen3-30b-a3b", "--tokens", "4096", "--ep", "2", "--from-run",
                 str(tmp_path / "nothing"), "--format", "json"]) == 2
    assert json.loads(capsys.readouterr().out)["field"] == "from_run"


def test_link_efficiencies_are_the_committed_measurements():
    """The per-link overlap efficiencies and the second wave are recomputed from the files they cite
    (benchmarks/estimator/second_wave.py): the efficiencies as the share kept of the model's own 1f1b gain with
    the second wave in its timeline, the median per link kind, at most 1."""
    import importlib

    from moe_overlap.skill.estimate import costs

    sw = importlib.import_module("benchmarks.estimator.second_wave")
    assert round(sw.second_wave(), 2) == costs.SECOND_WAVE
    per = sw.rederived()
    assert len(per["nvlink"]) == 3 and len(per["network"]) == 1
    assert sw.efficiencies(per) == {"nvlink": hw.NVLINK_OVERLAP_EFFICIENCY, "network": hw.NETWORK_OVERLAP_EFFICIENCY}
