"""The estimator's accuracy table (benchmarks/estimator/estimate_accuracy.py) and the behaviours issue 29/30 ask for."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def acc():
    path = ROOT / "benchmarks/estimator/estimate_accuracy.py"
    spec = importlib.util.spec_from_file_location("estimate_accuracy", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["estimate_accuracy"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_docs_table_is_the_scripts(acc):
    """docs/estimate.md holds `python benchmarks/estimator/estimate_accuracy.py`'s table, regenerated from the files."""
    doc = (ROOT / "docs/estimate.md").read_text(encoding="utf-8")
    start, end = "<!-- accuracy-table:start -->\n", "\n<!-- accuracy-table:end -->"
    committed = doc[doc.index(start) + len(start):doc.index(end)]
    assert committed == acc.markdown(acc.public_rows() + acc.our_rows()), (
        "docs/estimate.md is stale: paste `python benchmarks/estimator/estimate_accuracy.py` between the accuracy-table markers")


def test_every_committed_ep2_run_is_a_row(acc):
    rows = acc.our_rows()
    assert len(rows) >= 60  # r3..r5: 17 files, 1f1b and 1f1b+wgrad per preset
    assert {Path(r["source"]).parent.name for r in rows} == {f"h200x2_2026-11-29_r{i}" for i in (3, 4, 5)}


def test_every_predicted_schedule_row_of_every_committed_file_is_in_the_table(acc):
    """Every 1f1b / 1f1b+wgrad row (with or without an SM margin) of every committed EP 2 layer file is a table row;
    what is left out is only chunked (not predicted), nodes (a diagnostic) and 1f1b-devcnt (an ablation)."""
    import json
    import re

    wanted = set()
    for path in acc._files():
        data = json.loads(path.read_text(encoding="utf-8"))
        for p in data["presets"]:
            for r in p["rows"]:
                if re.fullmatch(r"1f1b(\+wgrad)?( sm-\d+)?", r["schedule"]):
                    wanted.add((str(path.relative_to(ROOT)), p["preset"], r["schedule"]))
                else:
                    assert r["schedule"] == "none" or r["schedule"] in ("nodes", "1f1b-devcnt") or \
                        r["schedule"].startswith("chunked:"), r["schedule"]
    got = {(r["source"], r["what"].split(", ")[1], r["what"].rsplit(": ", 1)[1]) for r in acc.our_rows()}
    assert got == wanted and len(got) == 116


def test_no_band_says_faster_where_a_slowdown_was_measured(acc):
    """Where a row's whole band is a speedup the estimator says "use" (decide.py); no committed measurement of
    such a row is a slowdown."""
    rows = [r for r in acc.public_rows() + acc.our_rows() if r["low"] is not None]
    assert len(rows) >= 120
    assert [r["what"] for r in rows if r["low"] >= 1.0 and acc._sign(r["measured"]) == "slower"] == []
    # nor any row's verdict the other way round: "avoid" where a gain over 3% was measured, "gain likely
    # negligible" where one over 10% was
    assert [(r["what"], acc.verdict(r), r["measured"]) for r in rows if acc._contradicts(r)] == []
    assert {acc.verdict(r) for r in rows} >= {"avoid", "use", "measure first"}  # every verdict is exercised


def test_negative_anchor_is_predicted_slower(acc):
    rows = {r["what"]: r for r in acc.public_rows()}
    small = rows["Qwen3-30B-A3B EP4 alltoall, 2 H100 nodes, GBS 64"]
    assert small["predicted"] < 0.97 and small["passes"]
    assert abs(rows["Qwen3-30B-A3B EP4 alltoall, 2 H100 nodes, GBS 8"]["predicted"] - 1) <= 0.03


def test_asks_once():
    with pytest.raises(EstimateError) as exc:
        parse_request({"hidden": 2048})
    for field in ("moe_ffn", "experts", "topk", "ep", "tokens", "fabric", "gpu_preset"):
        assert field in str(exc.value)


def test_defaults_from_model_and_gpu_and_micro_batches_from_global_batch():
    req = parse_request({"model": "qwen3-30b-a3b", "ep": 8, "gpu_preset": "gb200", "global_batch": 1024,
                         "dp": 16})
    assert (req.tokens, req.micro_batches, req.fabric, req.gpus_per_node) == (4096, 64, "gb200-nvlink+ib-400g", 72)
    with pytest.raises(EstimateError, match="not a multiple"):
        parse_request({"model": "qwen3-30b-a3b", "ep": 8, "gpu_preset": "h100", "global_batch": 100, "dp": 16})


def test_delayed_wgrad_differs_where_it_moves():
    # host-bound small EP: the deferred wgrad's closures cost host time
    r = estimate_overlap_benefit(parse_request({"model": "qwen3-30b-a3b", "ep": 4, "gpu_preset": "h100",
                                                "micro_batches": 8}))
    s = {x.name: x for x in r.schedules}
    assert s["1f1b+wgrad"].step_ms != s["1f1b"].step_ms
    assert any(x.startswith("delayed wgrad moves the critical path") for x in r.reasons)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4, 8, 16]), st.sampled_from([2, 8, 64]), st.sampled_from(["qwen3-30b-a3b", "deepseek-v3",
       "qwen3-next-80b-a3b"]), st.sampled_from(["h100", "b200"]), st.booleans())
def test_delayed_wgrad_changes_the_prediction_exactly_when_it_moves_the_critical_path(ep, m, model, gpu, host):
    r = estimate_overlap_benefit(parse_request({"model": model, "ep": ep, "gpu_preset": gpu, "micro_batches": m,
                                                "megatron_host": host}))
    s = {x.name: x for x in r.schedules}
    says_moves = any(x.startswith("delayed wgrad moves the critical path") for x in r.reasons)
    assert says_moves == (s["1f1b+wgrad"].step_ms != pytest.approx(s["1f1b"].step_ms, rel=1e-9))


def test_chunked_not_shown_and_use_only_outside_a_slowdown_band():
    for ep, m in ((4, 8), (16, 64), (8, 4)):
        r = estimate_overlap_benefit(parse_request({"model": "qwen3-30b-a3b", "ep": ep, "gpu_preset": "h100",
                                                    "micro_batches": m}))
        assert "chunked" not in [s.name for s in r.schedules]
        best = next(s for s in r.schedules if s.name == r.recommended_schedule)
        if r.recommendation == "use":
            assert best.speedup_low >= 1.0
        else:
            assert r.measure_next


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([2, 4, 8, 16, 32]), st.integers(1, 64), st.sampled_from(["qwen3-30b-a3b", "deepseek-v3",
       "qwen3-235b-a22b", "mixtral-8x7b"]), st.sampled_from(["h100", "h200", "b200", "gb200"]),
       st.sampled_from(["alltoall", "deepep", "hybridep"]), st.sampled_from([None, 1, 32]))
def test_never_use_where_the_band_includes_a_slowdown(ep, m, model, gpu, dispatcher, cdmc):
    experts = {"mixtral-8x7b": 8}.get(model, 128 if "qwen" in model else 256)
    if experts % ep:
        return
    r = estimate_overlap_benefit(parse_request({"model": model, "ep": ep, "gpu_preset": gpu, "micro_batches": m,
                                                "dispatcher": dispatcher, "cuda_device_max_connections": cdmc}))
    best = next(s for s in r.schedules if s.name == r.recommended_schedule)
    assert best.speedup_low <= best.speedup <= best.speedup_high
    if r.recommendation == "use":
        assert best.speedup_low >= 1.0 and not r.measure_next
    else:
        assert r.measure_next and any("verify" in x for x in r.measure_next)
