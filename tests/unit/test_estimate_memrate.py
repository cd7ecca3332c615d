"""The memory-bound term fed by measurement: shares of HBM peak per kind of pass (skill/estimate/memrate.py), applied
to another GPU's HBM peak; bad input names the field; the committed file and the proxy anchor (torch-free)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from moe_overlap.cli import main
from moe_overlap.skill.estimate import memrate
from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.schedules import layer_nodes as _nodes
from tests.verify_report import write_run

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = "benchmarks/results/h200x2_2026-11-29_r3/gpu_layer_after_router.json"
SMALL = dict(hidden=256, moe_ffn=128, experts=8, topk=2, tokens=512, ep=2, tflops=100.0, intra_gbps=100.0)
CUTLASS = "_ZN7cutlass13device_kernelIN2at4cuda6detail25enable_3x_kerne"


def layer_file(**over) -> dict:
    """A gpu_layer.py results file for D 256, F 128, 512 tokens x top-2, with round kernel times."""
    top = [[CUTLASS, 2, 1.0], ["_unpermute_bwd_kernel", 1, 0.003], ["_unpermute_fwd_kernel", 2, 0.004],
           ["_swiglu_bwd_kernel", 1, 0.002], ["void at::native::vectorized_gather_kernel<16, long>(char*, c", 1, 0.001],
           ["_swiglu_fwd_kernel", 1, 0.002], ["_permute_plan_kernel", 1, 0.05]]
    data = {"machine": {"gpu": "NVIDIA H200"}, "ceilings": {"copy_GBps": 3600.0},
            "shapes": {"small": {"shape": {"hidden": 256, "ffn": 128, "experts": 8, "tokens": 512, "topk": 2},
                                 "experts": {"wgrad_accumulate_one_chunk": {"median_ms": 0.5, "bytes": 2.4e9}},
                                 "layer": {"none": {"profile_fwd_bwd": {"gpu_kernel_ms": 1.2, "top_self_gpu": top}}}}}}
    for path, value in over.items():
        node = data
        *keys, last = path.split(".")
        for k in keys:
            node = node[k]
        node[last] = value
    return data


def test_shares_are_counted_bytes_over_measured_time_over_the_peak():
    m = memrate.from_layer_results(layer_file(), "f.json")
    routed, d, f = 512 * 2, 256, 128
    # gathers: 4 passes x 2*D elements x 2 bytes per routed row, in 0.001 + 0.004 + 0.003 ms
    assert m.efficiency.gather == pytest.approx(4 * 2 * d * routed * 2 / 0.008e-3 / 4800e9)
    assert m.efficiency.activation == pytest.approx(8 * f * routed * 2 / 0.004e-3 / 4800e9)
    assert m.efficiency.sort == pytest.approx(3600 / 4800)  # the device copy
    assert m.efficiency.wgrad == pytest.approx(2.4e9 / 0.5e-3 / 4800e9)
    assert m.kernel_ms["gemm"] == 1.0 and m.kernel_ms["other"] == pytest.approx(1.2 - 1.0 - 0.012)
    assert "f.json" in m.efficiency.source and "NVIDIA H200" in m.efficiency.source


def test_the_layer_with_the_weights_in_the_swiglu_reads_the_same_way():
    """Since the routing weights moved into the SwiGLU (EP 1), the gathers are other kernels: same counted bytes."""
    top = [[CUTLASS, 6, 1.0], ["_gather_rows_kernel", 2, 0.005], ["_unpermute_fwd_kernel", 2, 0.003],
           ["_swiglu_fwd_kernel", 1, 0.002], ["_swiglu_probs_bwd_kernel", 1, 0.003],
           ["_gather_1d_kernel", 1, 0.001]]  # the weights' permute: no row gather
    m = memrate.from_layer_results(layer_file(**{"shapes.small.layer.none.profile_fwd_bwd.top_self_gpu": top}), "f")
    assert m.efficiency.gather == pytest.approx(4 * 2 * 256 * 1024 * 2 / 0.008e-3 / 4800e9)
    assert m.efficiency.activation == pytest.approx(8 * 128 * 1024 * 2 / 0.005e-3 / 4800e9)
    assert "weights in the SwiGLU" in m.efficiency.source and m.kernel_ms["other"] == pytest.approx(1.2 - 1.013)
    # From dfae73e the two row gathers are index_select again: the same job.
    top[1] = ["void at::native::vectorized_gather_kernel<16, long>(char*, c", 2, 0.005]
    again = memrate.from_layer_results(layer_file(**{"shapes.small.layer.none.profile_fwd_bwd.top_self_gpu": top}), "f")
    assert again.efficiency == m.efficiency
    top[1] = ["_gather_rows_body", 2, 0.005]  # the autotuned Triton gather (MOE_OVERLAP_GATHER=triton)
    assert memrate.from_layer_results(layer_file(**{"shapes.small.layer.none.profile_fwd_bwd.top_self_gpu": top}),
                                      "f").efficiency == m.efficiency
    with pytest.raises(memrate.MemRateError, match="_swiglu_probs_bwd_kernel x1 \\(found 0\\)"):
        memrate.from_layer_results(layer_file(**{"shapes.small.layer.none.profile_fwd_bwd.top_self_gpu": top[:4]}),
                                   "f")


def test_the_memory_term_is_counted_bytes_at_the_share_of_the_target_peak():
    shares = {"gather": 1.25, "sort": 0.5, "activation": 0.8, "wgrad": 0.4}
    p = estimate_overlap_benefit(parse_request(dict(SMALL, gpu_preset="h100", hbm_efficiency=shares))).per_layer
    routed, d, f, b, peak = 1024, 256, 128, 2, 3350e9  # H100 SXM, NVIDIA datasheet
    assert p.permute_ms == pytest.approx(routed * 8 * d * b / (1.25 * peak) * 1e3)
    assert p.sort_ms == pytest.approx(routed * 8 * d * b / (0.5 * peak) * 1e3)
    assert p.activation_ms == pytest.approx(routed * 8 * f * b / (0.8 * peak) * 1e3)
    weights = 8 // 2 * 3 * d * f  # local experts' w1 + w2
    assert p.wgrad_write_ms == pytest.approx(weights * 3 * b / (0.4 * peak) * 1e3)
    # One number is every kind's share; hbm_gbps names a GPU without a preset.
    one = estimate_overlap_benefit(parse_request(dict(SMALL, hbm_gbps=8000.0, hbm_efficiency=0.5))).per_layer
    assert one.permute_ms == one.sort_ms == pytest.approx(routed * 8 * d * b / (0.5 * 8000e9) * 1e3)
    # Sort and unsort run beside the experts, permute and unpermute before and after them.
    n = _nodes(p)
    assert n.post_f == pytest.approx(p.permute_ms / 4)
    assert n.mlp_f - p.expert_fwd_ms - 3 / 8 * p.activation_ms == pytest.approx(p.sort_ms / 2)


def test_one_memory_rate_splits_as_before():
    p = estimate_overlap_benefit(parse_request(dict(SMALL, mem_gbps=1000.0))).per_layer
    assert p.permute_ms == p.sort_ms == pytest.approx(1024 * 8 * 256 * 2 / 1000e9 * 1e3)
    h = estimate_overlap_benefit(parse_request(dict(SMALL, mem_gbps=1000.0))).hardware
    assert h.mem_efficiency is None and h.hbm_gbps is None


@pytest.mark.parametrize("kw, field, words", [
    ({"hbm_efficiency": 0}, "hbm_efficiency", "> 0"),
    ({"hbm_efficiency": 2.5}, "hbm_efficiency", "<= 2"),
    ({"hbm_efficiency": True}, "hbm_efficiency", "a number"),
    ({"hbm_efficiency": "0.9"}, "hbm_efficiency", "a number"),
    ({"hbm_efficiency": {"gather": 1.0, "sort": 1.0, "activation": 1.0}}, "hbm_efficiency", "wgrad"),
    ({"hbm_efficiency": {"gather": 1.0, "sort": 1.0, "activation": 1.0, "wgrad": -1}}, "hbm_efficiency", "wgrad"),
    ({"hbm_efficiency": 0.9, "gpu_preset": "h100", "mem_gbps": 10.0}, "hbm_efficiency", "mem_gbps"),
    ({"hbm_efficiency": 0.9}, "hbm_efficiency", "HBM peak"),
    ({"hbm_gbps": 3350.0}, "hbm_gbps", "hbm_efficiency"),
])
def test_bad_input_names_the_field(kw, field, words):
    with pytest.raises(EstimateError) as err:
        estimate_overlap_benefit(parse_request(dict(SMALL, **kw)))
    assert err.value.field == field and words in str(err.value)


def test_kernel_times_file_and_gpu_problems_name_what_is_missing(tmp_path):
    bad = layer_file()
    top = bad["shapes"]["small"]["layer"]["none"]["profile_fwd_bwd"]["top_self_gpu"]
    top[:] = [k for k in top if k[0] != "_swiglu_bwd_kernel"]
    with pytest.raises(memrate.MemRateError, match="_swiglu_bwd_kernel x1 \\(found 0\\)"):
        memrate.from_layer_results(bad, "f.json")
    with pytest.raises(memrate.MemRateError, match="'NVIDIA H100 PCIe'.*HBM peak"):
        memrate.from_layer_results(layer_file(**{"machine.gpu": "NVIDIA H100 PCIe"}), "f.json")
    with pytest.raises(memrate.MemRateError, match="hidden 7168 and ffn 2048 .*small \\(hidden 256, ffn 128\\)"):
        memrate.from_layer_results(layer_file(), "f.json", hidden=7168, moe_ffn=2048)
    no_acc = layer_file()
    del no_acc["shapes"]["small"]["experts"]
    with pytest.raises(memrate.MemRateError, match="wgrad_accumulate_one_chunk"):
        memrate.from_layer_results(no_acc, "f.json")
    with pytest.raises(memrate.MemRateError, match="not a readable JSON"):
        memrate.load(tmp_path / "missing.json")
    assert memrate.MemRateError("x").field == "mem_rate"


def test_the_committed_measurement_by_hand():
    data = json.loads((ROOT / COMMITTED).read_text())
    s = data["shapes"]["deepseek-v3"]
    top = {k.split("(")[0]: ms for k, _, ms in s["layer"]["none"]["profile_fwd_bwd"]["top_self_gpu"]}
    gather_ms = (top["_unpermute_bwd_kernel"] + top["_unpermute_fwd_kernel"]
                 + top["void at::native::vectorized_gather_kernel<16, long>"])
    act_ms = top["_swiglu_bwd_kernel"] + top["_swiglu_fwd_kernel"]
    m = memrate.load(ROOT / COMMITTED, hidden=7168, moe_ffn=2048)
    rows = 4096 * 8
    assert m.efficiency.gather == pytest.approx(8 * 7168 * rows * 2 / (gather_ms * 1e-3) / 4.8e12)
    assert m.efficiency.activation == pytest.approx(8 * 2048 * rows * 2 / (act_ms * 1e-3) / 4.8e12)
    assert m.efficiency.sort == pytest.approx(data["ceilings"]["copy_GBps"] / 4800)
    acc = s["experts"]["wgrad_accumulate_one_chunk"]
    assert m.efficiency.wgrad == pytest.approx(acc["bytes"] / (acc["median_ms"] * 1e-3) / 4.8e12)
    assert (round(m.efficiency.gather, 2), round(m.efficiency.sort, 2), round(m.efficiency.activation, 2),
            round(m.efficiency.wgrad, 2)) == (1.08, 0.88, 0.79, 0.92)  # docs/estimate.md quotes these


def test_cli_mem_rate_and_its_bad_input(tmp_path, capsys):
    argv = ["estimate", "--model", "deepseek-v3-proxy", "--tokens", "4096", "--ep", "8", "--fabric", "h100-nvlink",
            "--gpu-preset", "h100", "--format", "json"]
    assert main(argv + ["--mem-rate", str(ROOT / COMMITTED)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["hbm_gbps"] == 3350 and COMMITTED.rsplit("/", 1)[1] in out["hardware"]["mem_efficiency"]["source"]
    assert any("HBM" in s for s in out["hardware"]["sources"])
    for extra, field in ((["--mem-rate", str(tmp_path / "none.json")], "mem_rate"),
                         (["--mem-rate", str(ROOT / COMMITTED), "--hbm-efficiency", "0.9"], "mem_rate"),
                         (["--hbm-efficiency", "0"], "hbm_efficiency"), (["--hbm-gbps", "3000"], "hbm_gbps")):
        assert main(argv + extra) == 2
        assert json.loads(capsys.readouterr().out)["field"] == field
    other = tmp_path / "other.json"
    other.write_text(json.dumps(layer_file()))
    assert main(argv + ["--mem-rate", str(other)]) == 2  # measured at another shape
    err = json.loads(capsys.readouterr().out)
    assert err["field"] == "mem_rate" and "hidden 7168" in err["error"] and "--hbm-efficiency" in err["fix"]


def test_a_runs_calibration_keeps_its_rates_beside_the_shares(tmp_path, capsys):
    """--from-run gives the GEMM and all-to-all rates; --mem-rate and --hbm-gbps give the memory term."""
    write_run(tmp_path)
    assert main(["estimate", "--model", "deepseek-v3-proxy", "--tokens", "4096", "--ep", "2", "--from-run",
                 str(tmp_path), "--hbm-gbps", "4800", "--mem-rate", str(ROOT / COMMITTED), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    h = out["hardware"]
    assert h["overlap_efficiency"] == 0.5 and h["hbm_gbps"] == 4800 and h["perm_ns_per_elem"] is None
    routed = 4096 * 8
    assert out["per_layer"]["sort_ms"] == pytest.approx(routed * 8 * 7168 * 2 / (4800e9 * h["mem_efficiency"]["sort"]) * 1e3)


@pytest.fixture()
def anchors():
    from benchmarks.estimator import estimate_anchors

    return estimate_anchors


def test_the_proxy_anchor_sums_its_calibrated_terms(anchors):
    proxy = next(r for r in anchors.anchor_rows() if r["what"].startswith("DeepSeek-V3 proxy"))
    terms = proxy["terms_calibrated_ms"]
    assert sum(terms.values()) == pytest.approx(proxy["predicted_calibrated"])
    assert anchors.MEM_RATE_FILE in proxy["source"] and anchors.GEMM_RATE_FILE in proxy["source"]
    m = memrate.load(ROOT / anchors.MEM_RATE_FILE, hidden=7168, moe_ffn=2048)
    rows = 4096 * 8
    assert terms["sort/unsort"] == pytest.approx(rows * 8 * 7168 * 2 / (3350e9 * m.efficiency.sort) * 1e3)
    assert terms["permute/unpermute"] == pytest.approx(rows * 8 * 7168 * 2 / (3350e9 * m.efficiency.gather) * 1e3)
    # The memory term is not where the anchor's miss is: GEMMs and all-to-alls alone exceed the measured time.
    assert terms["expert GEMMs"] + terms["all-to-alls"] > anchors.PROXY_MEASURED_MS
    presets_memory = next(r for r in anchors.anchor_rows(anchors.GEMM_RATE_FILE, None)
                          if r["what"].startswith("DeepSeek-V3 proxy"))
    assert presets_memory["terms_calibrated_ms"]["expert GEMMs"] == pytest.approx(terms["expert GEMMs"])
    assert presets_memory["predicted_calibrated"] != pytest.approx(proxy["predicted_calibrated"])
    bad = copy.deepcopy(json.loads((ROOT / anchors.MEM_RATE_FILE).read_text()))
    bad["machine"]["gpu"] = "a toaster"
    with pytest.raises(anchors.InputError, match="--mem-rate .*a toaster"):
        anchors.mem_shares(_write(bad), anchors.PROXY_SHAPE)


def _write(data: dict) -> str:
    import tempfile

    fd = tempfile.NamedTemporaryFile("w", suffix=".json", delete=False)
    with fd:
        json.dump(data, fd)
    return fd.name


def test_docs_show_the_table_the_script_prints(anchors):
    """docs/estimate.md's table is `python benchmarks/estimator/estimate_anchors.py`'s, row for row (regenerate it)."""
    import glob

    files = sorted(glob.glob(str(ROOT / "benchmarks" / "results" / "**" / "ep_overlap_cuda_r*.json"), recursive=True))
    printed = anchors.markdown(anchors.anchor_rows() + anchors.our_rows(files)).splitlines()
    doc = (ROOT / "docs" / "estimate.md").read_text(encoding="utf-8").splitlines()
    wanted = [line for line in printed if line.startswith("| ") or ", terms " in line or "outside the modelled" in line]
    stale = [line for line in wanted if line not in doc]
    assert len(wanted) > 40 and stale == [], (
        "docs/estimate.md's table is stale (new results under benchmarks/results/?): paste the table and its "
        "'terms'/'outside the modelled' lines of `python benchmarks/estimator/estimate_anchors.py`; missing:\n" + "\n".join(stale))
