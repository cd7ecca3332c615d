"""benchmarks/gpu/ep_overlap.py: the CPU smoke run on 2 gloo ranks writes every row with sane numbers, and the
efficiency arithmetic is the documented formula (timings themselves are never asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu" / "ep_overlap.py"
ROWS = ["none", "chunked:2", "chunked:4", "nodes", "1f1b", "1f1b+wgrad", "1f1b-devcnt"]


def _module():
    spec = importlib.util.spec_from_file_location("ep_overlap_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("ep_overlap") / "smoke.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--world", "2",
                           "--rounds", "2", "--warmup", "1", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1f1b+wgrad" in proc.stdout and "alone: comm" in proc.stdout  # the printed table
    return json.loads(out.read_text())


def test_smoke_json_has_every_row_and_sane_numbers(smoke):
    assert smoke["world"] == smoke["ep_size"] == 2 and smoke["backend"] == "gloo"
    for key in ("command", "date", "machine", "versions", "rounds", "warmup"):
        assert smoke[key], key
    assert smoke["versions"]["torch"]
    (p,) = smoke["presets"]
    assert p["preset"] == "tiny" and p["local_experts"] == 4
    assert [r["schedule"] for r in p["rows"]] == ROWS
    for r in p["rows"]:
        assert r["total_ms"] > 0, r
        if r["schedule"] in ("1f1b", "1f1b+wgrad", "1f1b-devcnt"):
            assert r["fwd_ms"] is None and r["reference"] == "nodes"
        else:
            assert r["fwd_ms"] > 0 and r["bwd_ms"] > 0
            assert math.isclose(r["total_ms"], r["fwd_ms"] + r["bwd_ms"])
        if r["reference"] is not None:
            assert math.isfinite(r["overlap_efficiency"]) and r["speedup_vs_reference"] > 0
    a = p["alone"]
    for key in ("comm_fwd_ms", "comm_bwd_ms", "compute_fwd_ms", "compute_bwd_ms", "count_exchange_ms"):
        assert a[key] > 0, key
    assert math.isclose(p["hideable_ms"], min(a["comm_ms"], a["compute_ms"]))
    # Balanced top-2 of 8 experts over 2 ranks: each rank receives T*K rows, and each local expert gets
    # T*K/E rows from each of the 2 ranks.
    assert p["rows_received"] == 64 * 2
    assert p["tokens_per_local_expert_min"] == p["tokens_per_local_expert_max"] == 2 * 64 * 2 // 8
    assert all(v["n"] == 2 for v in p["median_ms"].values())
    # The timed overlapped paths compute the sequential ones' result (fp32 on CPU: to rounding).
    agree = p["agreement_rel_l2"]
    assert len(agree) == 3 and all(0 <= v < 1e-5 for v in agree.values()), agree


def test_every_rank_ran_with_nvlink_multicast_off(smoke):
    assert len(smoke["rank_env"]) == 2
    for env in smoke["rank_env"]:
        assert {k: env[k] for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")} \
            == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def _times(**ms):
    return {k: {"median_ms": v, "min_ms": v, "n": 1} for k, v in ms.items()}


def test_efficiency_is_the_documented_formula():
    mod = _module()
    t = _times(**{"none/fwd": 10.0, "none/bwd": 20.0, "chunked:2/fwd": 8.0, "chunked:2/bwd": 16.0,
                  "nodes/fwd": 11.0, "nodes/bwd": 21.0, "1f1b/pair": 26.0, "1f1b+wgrad/pair": 24.0,
                  "alone/a2a dispatch": 2.0, "alone/a2a combine": 2.0, "alone/a2a grad-combine": 2.0,
                  "alone/a2a grad-dispatch": 2.0, "alone/experts fwd": 5.0, "alone/experts dgrad": 5.0,
                  "alone/experts wgrad": 5.0, "alone/count exchange": 0.5})
    d = mod.derive({"times": t}, [2])
    rows = {r["schedule"]: r for r in d["rows"]}
    assert d["alone"]["comm_ms"] == 8.0 and d["alone"]["compute_ms"] == 15.0 and d["hideable_ms"] == 8.0
    assert rows["chunked:2"]["overlap_efficiency"] == pytest.approx((30 - 24) / 8)
    assert rows["chunked:2"]["fwd_efficiency"] == pytest.approx((10 - 8) / min(4, 5))
    assert rows["chunked:2"]["bwd_efficiency"] == pytest.approx((20 - 16) / min(4, 10))
    assert rows["1f1b"]["overlap_efficiency"] == pytest.approx((32 - 26) / 8)
    assert rows["1f1b+wgrad"]["speedup_vs_reference"] == pytest.approx(32 / 24)
    assert "overlap_efficiency" not in rows["none"] and "overlap_efficiency" not in rows["nodes"]


def test_megatron_proxy_comparison_only_for_the_proxy_shape():
    mod = _module()
    rows = [{"schedule": "none", "fwd_ms": 3.56, "bwd_ms": 5.24, "total_ms": 8.8},
            {"schedule": "1f1b", "fwd_ms": None, "bwd_ms": None, "total_ms": 7.0}]
    assert mod.megatron_comparison("deepseek-v3", 8, rows) is None
    m = mod.megatron_comparison("dsv3-proxy", 8, rows)
    assert m["fwd_ms"] == 7.12 and m["bwd_ms"] == 10.48 and m["comparable_world"]
    assert m["fwd_ratio_ours_over_megatron"] == pytest.approx(0.5)
    assert m["megatron_total_ms"] == pytest.approx(17.6) and m["ours_best_schedule"] == "1f1b"
    assert not mod.megatron_comparison("dsv3-proxy", 4, rows)["comparable_world"]


def test_layer_seed_none_skips_the_host_draw_and_still_runs():
    import torch

    from moe_overlap.ep.layer import MoELayer, init_full_weights

    layer = MoELayer(8, 4, 4, 2, None, seed=None, force_balance=True)
    full = init_full_weights(8, 4, 4, 0)
    assert not torch.equal(layer.experts.w1.detach(), full["experts.w1"])  # not the seeded init
    out, _ = layer(torch.randn(5, 8))
    assert out.shape == (5, 8) and torch.isfinite(out).all()


def test_markdown_tables_from_the_smoke_json(smoke, tmp_path):
    path = tmp_path / "r.json"
    path.write_text(json.dumps(smoke))
    proc = subprocess.run([sys.executable, str(SCRIPT), "--markdown", str(path)], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    table = [line for line in proc.stdout.splitlines() if line.startswith("| ") and "schedule" not in line]
    assert [line.split("|")[1].strip() for line in table] == ROWS
