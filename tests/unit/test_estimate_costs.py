"""The estimator's shared cost parameters (skill/estimate/costs.py) recomputed from the committed files."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from moe_overlap.skill.estimate import costs, hardware
from moe_overlap.skill.estimate.api import estimate_overlap_benefit, parse_request

ROOT = Path(__file__).resolve().parents[2]


def test_host_cost_per_op_is_the_median_of_the_committed_runs():
    hosts = []
    for path in sorted(ROOT.glob("benchmarks/**/h200x2_2026-11-29_r[345]/*ep_overlap*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if (data.get("fabric") or "native") != "native":
            continue
        hosts += [p["rows"][0]["host_ms"] for p in data["presets"] if p["rows"][0].get("host_ms")]
    assert len(hosts) == 30
    assert costs.HOST_US_PER_OP == pytest.approx(statistics.median(hosts) / costs.OPS_PER_LAYER * 1e3, abs=0.05)


def test_host_work_grows_with_local_experts():
    assert costs.host_ms_megatron(128, 4) > costs.host_ms_megatron(128, 16)
    assert costs.host_ms_megatron(128, 16) == pytest.approx(16.8 * (370 + 6 * 8) / 1e3)


def test_single_queue_halves_the_overlap():
    base = dict(model="deepseek-v3", gpu_preset="h100", ep=16, micro_batches=16, layers=4)
    many = estimate_overlap_benefit(parse_request(dict(base, cuda_device_max_connections=32)))
    one = estimate_overlap_benefit(parse_request(dict(base, cuda_device_max_connections=1)))
    assert one.hardware.overlap_efficiency == pytest.approx(many.hardware.overlap_efficiency * 0.5)
    assert one.predicted_speedup < many.predicted_speedup


def test_backends_carry_their_published_bandwidth():
    base = dict(model="qwen3-30b-a3b", gpu_preset="h100", ep=16, micro_batches=8)
    r = estimate_overlap_benefit(parse_request(dict(base, dispatcher="deepep")))
    assert (r.hardware.intra_gbps, r.hardware.inter_gbps) == (153.0, 58.0)
    assert any("DeepEP README" in s for s in r.hardware.sources)


@pytest.mark.parametrize("name, peak", [("b200", 2250), ("gb200", 2500)])
def test_blackwell_presets_cite_their_datasheets(name, peak):
    gpu = hardware.gpu_preset(name)
    assert "nvidia.com/en-us/data-center" in gpu.source and "not measured" in gpu.source
    assert gpu.expert_tflops == pytest.approx(642.6 / 989 * peak) and gpu.hbm_gbps == 8000.0
    r = estimate_overlap_benefit(parse_request({"model": "qwen3-30b-a3b", "ep": 8, "gpu_preset": name,
                                                "micro_batches": 8}))
    assert r.request.fabric == gpu.default_fabric


def test_ep_placement_moves_traffic_off_the_node():
    base = dict(model="qwen3-30b-a3b", gpu_preset="h100", ep=8, micro_batches=8)
    packed = estimate_overlap_benefit(parse_request(base))
    spread = estimate_overlap_benefit(parse_request(dict(base, ep_stride=2)))  # TP 2: 4 EP ranks per node
    assert packed.per_layer.a2a_inter_bytes == 0 and spread.per_layer.a2a_inter_bytes > 0
    assert spread.per_layer.a2a_ms > packed.per_layer.a2a_ms
