"""benchmarks/peers/peers.py without a GPU: the weight layouts of the peers, the balanced routing given to Megatron-Core,
the agreement arithmetic and the results table. torchtitan's own GroupedExperts is checked where it imports."""

from __future__ import annotations

import json
import math

import pytest
import torch

from benchmarks.peers import peers, peers_body, peers_megatron, peers_titan
from moe_overlap.ep.experts import experts_forward
from moe_overlap.ep.refs import reference_expert
from moe_overlap.ep.router import route  # noqa: E402

L, D, F = 3, 16, 8


def _weights(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(L, D, 2 * F, generator=g, dtype=dtype) / D ** 0.5,
            torch.randn(L, F, D, generator=g, dtype=dtype) / F ** 0.5)


def test_titan_layout_round_trips_exactly():
    w1, w2 = _weights()
    t = peers_titan.ours_to_titan(w1, w2)
    assert t["w1_EFD"].shape == t["w3_EFD"].shape == (L, F, D) and t["w2_EDF"].shape == (L, D, F)
    back1, back2 = peers_titan.titan_to_ours(t["w1_EFD"], t["w3_EFD"], t["w2_EDF"])
    assert torch.equal(back1, w1) and torch.equal(back2, w2)


def test_titan_layout_computes_our_expert_and_a_swapped_one_does_not():
    w1, w2 = _weights()
    x = torch.randn(5, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    t = peers_titan.ours_to_titan(w1, w2)
    for j in range(L):
        ours = torch.stack([reference_expert(row, w1[j], w2[j]) for row in x])
        theirs = peers_titan.titan_expert_math(x, t["w1_EFD"][j], t["w3_EFD"][j], t["w2_EDF"][j])
        torch.testing.assert_close(theirs, ours, rtol=1e-12, atol=1e-12)
        swapped = peers_titan.titan_expert_math(x, t["w3_EFD"][j], t["w1_EFD"][j], t["w2_EDF"][j])
        assert peers_body.rel_l2(swapped, ours) > 0.1  # gate and up are not interchangeable


def test_titan_layout_refuses_mismatched_shapes():
    w1, w2 = _weights()
    with pytest.raises(ValueError, match="2\\*F"):
        peers_titan.ours_to_titan(w1[..., :F + 1], w2)


def test_megatron_grouped_storage_is_our_layout():
    """GroupedMLP keeps weight1 [D, L*2F] and reads it as .view(L, D, -1); its glu takes chunk 0 as the gate."""
    w1, w2 = _weights()
    weight1, weight2 = torch.empty(D, L * 2 * F, dtype=w1.dtype), torch.empty(L * F, D, dtype=w2.dtype)
    v1, v2 = peers_megatron.grouped_views(weight1, weight2, L, D)
    v1.copy_(w1)
    v2.copy_(w2)
    x = torch.randn(4, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    for j in range(L):
        gate, up = torch.chunk(x @ weight1.view(L, D, -1)[j], 2, dim=-1)  # GroupedMLP.forward + its glu
        got = (torch.nn.functional.silu(gate) * up) @ weight2.view(L, -1, D)[j]
        want = torch.stack([reference_expert(row, w1[j], w2[j]) for row in x])
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_megatron_routing_is_our_balanced_routing():
    T, E, K = 10, 8, 3
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(T, D, generator=g), torch.randn(E, D, generator=g)
    ours = route(x, w, topk=K, normalize=True, force_balance=True)
    probs_TE, map_TE = peers_megatron.balanced_routing(E, K)((x @ w.t()).view(T, 1, E))
    assert probs_TE.shape == map_TE.shape == (T, E) and map_TE.dtype == torch.bool
    assert torch.equal(map_TE, torch.zeros(T, E, dtype=torch.bool).scatter(1, ours.experts_TK, True))
    torch.testing.assert_close(probs_TE.gather(1, ours.experts_TK), ours.probs_TK)
    assert float(probs_TE.masked_fill(map_TE, 0).abs().sum()) == 0.0


def test_rel_l2_and_compare():
    a = torch.tensor([3.0, 4.0])
    assert peers_body.rel_l2(a, a) == 0.0
    assert peers_body.rel_l2(a * 1.01, a) == pytest.approx(0.01)
    assert peers_body.rel_l2(a[:1], a) == math.inf and peers_body.rel_l2(None, a) == math.inf
    got = peers_body.compare({"out": a, "dx": a * 2}, {"out": a, "dx": a})
    assert got["out"] == 0.0 and got["dx"] == pytest.approx(1.0)
    assert got["experts.w1"] == math.inf  # a gradient one side lacks is a disagreement, not a pass


def test_full_weights_are_seeded_and_scaled():
    shape = dict(tokens=4, hidden=64, ffn=32, experts=4, topk=2)
    a = peers_body.full_weights(shape, torch.device("cpu"), 5)
    b = peers_body.full_weights(shape, torch.device("cpu"), 5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert a["experts.w1"].shape == (4, 64, 64) and a["experts.w2"].shape == (4, 32, 64)
    assert float(a["experts.w1"].std()) == pytest.approx(64 ** -0.5, rel=0.1)
    assert not torch.equal(a["router.weight"], peers_body.full_weights(shape, torch.device("cpu"), 6)["router.weight"])


def _doc(titan_worst=5e-3):
    def timing(ms):
        return {"median_ms": ms, "min_ms": ms, "n": 3}

    keys = ("out", "dx", "router.weight", "experts.w1", "experts.w2")
    return {"command": "python benchmarks/peers/peers.py --device cpu", "date": "2026-01-01T00:00:00+00:00",
            "machine": {"gpu": None}, "versions": {"torch": "2.x", "torchtitan": "0.3.0"}, "world": 2,
            "dtype": "bfloat16", "tolerance": 2e-2, "notes": ["a note"],
            "presets": [{"preset": "tiny", "impls": {
                "ours": {"fwd": timing(1.0), "fwd_bwd": timing(2.0), "describe": {}},
                "torchtitan": {"fwd": timing(1.5), "fwd_bwd": timing(3.0), "describe": {}}},
                "errors": {"megatron": "RuntimeError: needs CUDA\ntraceback..."},
                "agreement_rel_l2": {
                    "ours": {"vs_ours": dict.fromkeys(keys, 0.0), "vs_fp32": dict.fromkeys(keys, 4e-3)},
                    "torchtitan": {"vs_ours": {**dict.fromkeys(keys, 1e-3), "dx": titan_worst},
                                   "vs_fp32": dict.fromkeys(keys, 6e-3)}}}]}


def test_table_rows_ratio_verdict_and_errors():
    rows = {r["impl"]: r for r in peers.table_rows(_doc())}
    assert rows["torchtitan"]["vs_ours"] == pytest.approx(1.5) and rows["torchtitan"]["agrees"] is True
    assert rows["torchtitan"]["worst_key"] == "dx" and rows["torchtitan"]["worst_vs_fp32"] == 6e-3
    assert rows["megatron"]["error"] == "RuntimeError: needs CUDA" and rows["megatron"]["fwd_bwd_ms"] is None
    bad = {r["impl"]: r for r in peers.table_rows(_doc(titan_worst=0.5))}
    assert bad["torchtitan"]["agrees"] is False


def test_markdown_table_and_reprint_from_json(tmp_path, capsys):
    doc = _doc()
    text = peers.markdown(doc)
    assert "| tiny | 2 | torchtitan | 1.500 | 3.000 | 1.50 | 5.0e-03 (dx) | 6.0e-03 |" in text
    assert "| tiny | 2 | megatron | did not run: RuntimeError: needs CUDA |" in text
    assert "`python benchmarks/peers/peers.py --device cpu`" in text and "- a note" in text
    path = tmp_path / "r.json"
    path.write_text(json.dumps(doc))
    assert peers.main(["--markdown", str(path)]) == 0
    assert capsys.readouterr().out.strip() == text


def test_check_run_names_the_option_to_change():
    assert peers.check_run("cpu", 2, ["tiny"], 0) is None
    assert "--device cuda" in peers.check_run("cuda", 1, ["tiny"], 0)
    assert "--world 3" in peers.check_run("cpu", 3, ["tiny"], 0)  # 8 experts
    assert "--world 4" in peers.check_run("cuda", 4, ["qwen3-30b-a3b"], 2)
    assert peers.check_run("cuda", 2, list(peers.GPU_PRESETS), 2) is None


@pytest.mark.skipif(peers_titan.import_error() is not None, reason="torchtitan not importable here")
def test_torchtitan_grouped_experts_with_our_weights_compute_our_experts():
    """Its real GroupedExperts (forward and backward) against ours, through the layout mapping; a gate/up swap
    must show."""
    from torchtitan.models.common.moe import GroupedExperts

    counts = (5, 0, 7)
    w1, w2 = (w.to(torch.bfloat16) for w in _weights(dtype=torch.float32))
    x = torch.randn(sum(counts), D, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    theirs = GroupedExperts.Config(dim=D, hidden_dim=F, num_experts=L).build().to(torch.bfloat16)
    mapped = peers_titan.ours_to_titan(w1, w2)
    with torch.no_grad():
        for name, value in mapped.items():
            getattr(theirs, name).copy_(value)
    xt = x.clone().requires_grad_()
    y = theirs(xt, torch.tensor(counts))
    want = experts_forward(x, w1, w2, counts)[0]
    assert peers_body.rel_l2(y, want) < 2e-2
    y.float().square().sum().backward()
    dw1, dw2 = peers_titan.titan_to_ours(theirs.w1_EFD.grad, theirs.w3_EFD.grad, theirs.w2_EDF.grad)
    xr, w1r, w2r = (t.double().requires_grad_() for t in (x, w1, w2))
    ys, start = [], 0
    for j, c in enumerate(counts):
        ys.append(torch.stack([reference_expert(r, w1r[j], w2r[j]) for r in xr[start:start + c]]) if c
                  else xr.new_zeros(0, D))
        start += c
    torch.cat(ys).square().sum().backward()
    for got, ref in ((xt.grad, xr.grad), (dw1, w1r.grad), (dw2, w2r.grad)):
        assert peers_body.rel_l2(got, ref) < 3e-2
    with torch.no_grad():
        theirs.w1_EFD.copy_(mapped["w3_EFD"])
        theirs.w3_EFD.copy_(mapped["w1_EFD"])
    assert peers_body.rel_l2(theirs(x, torch.tensor(counts)), want) > 0.1


@pytest.mark.skipif(peers_titan.import_error() is not None, reason="torchtitan not importable here")
def test_torchtitan_moe_at_ep1_without_a_mesh_still_agrees_and_says_so(monkeypatch):
    """Where its mesh cannot be built (another torch than it was written for), EP 1 runs its MoE unparallelized,
    as its partial_dtensor path does, and the note says so; the layer still computes ours."""
    import torchtitan.distributed.parallel_dims as pdims

    def broken(self):
        raise RuntimeError("no mesh on this torch")

    monkeypatch.setattr(pdims.ParallelDims, "build_mesh", broken)
    monkeypatch.setattr(pdims, "device_type", pdims.device_type)  # restored after the test
    shape = dict(tokens=12, hidden=D, ffn=F, experts=4, topk=2)
    full = peers_body.full_weights(shape, torch.device("cpu"), 0)
    weights = [full[k].to(torch.bfloat16) for k in peers_body.GRAD_KEYS]
    titan = peers_titan.TitanMoE(shape, 0, 1, torch.device("cpu"), torch.bfloat16)
    assert any("no mesh on this torch" in n and "unparallelized" in n for n in titan.notes)
    assert titan.describe()["parallel_dims"] is None
    ours = peers_body.Ours(shape, None, torch.device("cpu"), torch.bfloat16)
    for impl in (titan, ours):
        impl.load(*weights)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(12, D, generator=g).to(torch.bfloat16)
    gout = torch.randn(12, D, generator=g).to(torch.bfloat16)
    got = peers_body.compare(peers_body.run_once(titan, x, gout), peers_body.run_once(ours, x, gout))
    assert max(got.values()) < 2e-2, got
