"""MoELayer on 1, 2 and 4 gloo ranks against the float64 single-process reference (refs.py).

Rank-marked inputs; output, input gradient and every weight gradient within 1e-5 (relative to the
largest reference entry, floored at 1e-6) in fp32, for schedules none and chunked, incl. skewed routing (a rank with
no token, experts with no token), top-k 1, top-k = E, more chunks than tokens, both GEMM paths.
"""

import pytest
import torch

from tests.distributed._spawn import run_ranks

CASES = {
    # name: (D, F, E, K, score, tokens(rank), chunks, skew, aux_coeff, z_coeff, force_balance)
    "softmax-k2": (8, 8, 4, 2, "softmax", lambda r: 5 + r, 2, False, 0.01, 0.0, False),
    "softmax-k1": (8, 8, 4, 1, "softmax", lambda r: 6, 3, False, 0.0, 0.0, False),
    "sigmoid-topk-eq-E": (8, 8, 4, 4, "sigmoid", lambda r: 4, 2, False, 0.0, 1e-3, False),
    "skewed": (8, 8, 8, 2, "softmax", lambda r: 0 if r == 0 else 5, 2, True, 0.01, 0.0, False),
    "chunks-gt-tokens": (8, 8, 4, 2, "softmax", lambda r: 1 + r % 2, 7, False, 0.0, 0.0, False),
    "loop-path-balanced": (6, 3, 4, 2, "softmax", lambda r: 4, 2, False, 0.0, 0.0, True),
}
RUNS = [("none", None), ("chunked", None), ("none", "store"), ("chunked", "store")]


def _full_weights(name):
    from moe_overlap.ep.layer import init_full_weights

    d, f, e, *_ = CASES[name]
    full = init_full_weights(d, f, e, seed=3)
    if CASES[name][7]:  # skew: expert 0 wins every (positive) token; softmax not saturated
        full["router.weight"][0] = 0.6
    return full


def _inputs(name, rank):
    d, tokens, skew = CASES[name][0], CASES[name][5](rank), CASES[name][7]
    g = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(tokens, d, generator=g) + 0.25 * rank  # rank-marked
    if skew:
        x = x.abs() + 0.5
    gout = torch.randn(tokens, d, generator=g)
    return x, gout


def _layer_body(rank, world, group):
    from moe_overlap.ep.layer import MoELayer, shard_full_weights
    from moe_overlap.ep.wgrad import WgradStore

    results = {}
    for name, (d, f, e, k, score, _, chunks, _, aux_c, z_c, balance) in CASES.items():
        layer = MoELayer(d, f, e, k, group, score=score, z_loss_coeff=z_c, force_balance=balance)
        layer.load_state_dict(shard_full_weights(_full_weights(name), rank, world))
        x0, gout = _inputs(name, rank)
        for schedule, store_kind in RUNS:
            layer.zero_grad(set_to_none=True)
            store = WgradStore() if store_kind else None
            x = x0.clone().requires_grad_()
            out, aux = layer(x, schedule=schedule, chunks=chunks, wgrad_store=store)
            ((out * gout).sum() + aux_c * aux).backward()
            if store is not None:
                assert layer.experts.w1.grad is None and store.pending >= 1
                store.run_all()
            results[(name, schedule, store_kind)] = {
                "out": out.detach(), "x": x.grad, "router": layer.router.weight.grad,
                "w1": layer.experts.w1.grad, "w2": layer.experts.w2.grad,
            }
        # chunked with one chunk runs the same ops in the same order as none: bitwise equal.
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out, aux = layer(x, schedule="chunked", chunks=1)
        ((out * gout).sum() + aux_c * aux).backward()
        ref = results[(name, "none", None)]
        results[(name, "chunked-1-bitwise-none")] = all(
            torch.equal(a, b) if a is not None else b is None
            for a, b in ((out.detach(), ref["out"]), (x.grad, ref["x"]), (layer.router.weight.grad, ref["router"]),
                         (layer.experts.w1.grad, ref["w1"]), (layer.experts.w2.grad, ref["w2"])))
    errors = []
    for kwargs in ({"num_experts": 3}, {"topk": 0}, {"topk": 9}):
        args = {"hidden": 8, "ffn": 8, "num_experts": 8, "topk": 2} | kwargs
        try:
            MoELayer(**args, group=group)
        except ValueError as err:
            errors.append(str(err))
    return results, errors


def _grad(t):
    """A leaf's gradient; zeros where nothing reached it (e.g. the one rank has no token)."""
    return t.grad if t.grad is not None else torch.zeros_like(t)


def _zeros_if_none(t, like):
    return t if t is not None else torch.zeros(like.shape, dtype=torch.float32)


def _rel(got, want):
    scale = want.abs().max().item() if want.numel() else 0.0
    return (got.double() - want).abs().max().item() / max(scale, 1e-6) if want.numel() else 0.0


@pytest.mark.parametrize("world", [1, 2, 4])
def test_layer_matches_reference(world):
    from moe_overlap.ep.refs import reference_moe

    per_rank = run_ranks(_layer_body, world, timeout=240)
    for name, (_, _, e, k, score, _, _, _, aux_c, z_c, balance) in CASES.items():
        full = {n: w.double().requires_grad_() for n, w in _full_weights(name).items()}
        xs, gouts = zip(*[_inputs(name, r) for r in range(world)], strict=True)
        xs = [x.double().requires_grad_() for x in xs]
        outs, auxes, zs = reference_moe(xs, full, topk=k, score=score, force_balance=balance)
        loss = sum((o * g.double()).sum() for o, g in zip(outs, gouts, strict=True))
        loss = loss + aux_c * sum(auxes) + z_c * sum(zs)
        loss.backward()
        local = e // world
        if CASES[name][7]:  # the skewed case really is skewed: expert 0 first everywhere, some expert idle
            from moe_overlap.ep.refs import reference_route

            chosen = [reference_route(x.detach(), full["router.weight"].detach(), topk=k)[1] for x in xs]
            used = torch.cat(chosen)
            assert (used[:, 0] == 0).all() and len(set(used.reshape(-1).tolist())) < e
        for run in RUNS:
            got = [res[(name, *run)] for res, _ in per_rank]
            checks = {
                "out": (torch.cat([g["out"] for g in got]), torch.cat([o.detach() for o in outs])),
                "x.grad": (torch.cat([_zeros_if_none(g["x"], x) for g, x in zip(got, xs, strict=True)]),
                           torch.cat([_grad(x) for x in xs])),
                "router.grad": (sum(_zeros_if_none(g["router"], full["router.weight"]) for g in got),
                                _grad(full["router.weight"])),
                "w1.grad": (torch.cat([g["w1"] for g in got]), _grad(full["experts.w1"])),
                "w2.grad": (torch.cat([g["w2"] for g in got]), _grad(full["experts.w2"])),
            }
            for what, (a, b) in checks.items():
                assert a.dtype == torch.float32 and a.shape == b.shape, (name, run, what)
                assert _rel(a, b) <= 1e-5, f"{name} {run} {what}: rel err {_rel(a, b):.2e}"
            assert got[0]["w1"].shape[0] == local
        # Deferred wgrad gives bitwise the immediate weight gradient, for both schedules.
        for res, _ in per_rank:
            assert res[(name, "chunked-1-bitwise-none")], name
            for schedule in ("none", "chunked"):
                for w in ("w1", "w2"):
                    assert torch.equal(res[(name, schedule, None)][w], res[(name, schedule, "store")][w])
    for _, errors in per_rank:
        want = ["topk=0", "topk=9"] + (["num_experts=3"] if world in (2, 4) else [])
        assert sorted(errors) == sorted(e for e in errors if any(w in e for w in want))
        assert all(any(w in e for e in errors) for w in want), errors


# ---------------------------------------------------------------- single process (no group)
def _single_layer(**kw):
    from moe_overlap.ep.layer import MoELayer

    return MoELayer(8, 8, 4, 2, **kw)


@pytest.mark.parametrize("call,needle", [
    (lambda m: m(torch.zeros(3, 7)), "hidden size 7 != layer hidden=8"),
    (lambda m: m(torch.zeros(3, 8, dtype=torch.float64)), "x dtype=torch.float64"),
    (lambda m: m(torch.zeros(3, 8, dtype=torch.bfloat16)), "x dtype=torch.bfloat16 != layer dtype"),
    (lambda m: m(torch.zeros(3, 8, device="meta")), "x device=meta"),
    (lambda m: m(torch.zeros(3, 8), schedule="chunked", chunks=0), "chunks=0"),
    (lambda m: m(torch.zeros(3, 8), schedule="1f1b"), "schedule='1f1b'"),
])
def test_bad_forward_input_names_the_parameter(call, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace("[", r"\[")):
        call(_single_layer())


@pytest.mark.parametrize("kw,needle", [
    ({"dtype": torch.float64}, "dtype=torch.float64"), ({"score": "relu"}, "score='relu'"),
])
def test_bad_construction(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _single_layer(**kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_layer_close_to_fp32(dtype):
    layer = _single_layer()
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(0))
    want, _ = layer(x)
    lp = _single_layer(dtype=dtype)
    for schedule in ("none", "chunked"):
        got, aux = lp(x.to(dtype).requires_grad_(), schedule=schedule, chunks=3)
        assert got.dtype == dtype and aux.dtype == torch.float32
        torch.testing.assert_close(got.float(), want.detach(), rtol=5e-2, atol=5e-2)
        got.float().sum().backward()
        assert lp.experts.w1.grad.dtype == dtype


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_inputs_bitwise_same_outputs(dtype):
    layer = _single_layer(dtype=dtype)
    x0 = torch.randn(10, 8, generator=torch.Generator().manual_seed(1)).to(dtype)
    runs = []
    for schedule, chunks in (("chunked", 3), ("none", 1), ("chunked", 3), ("none", 1)):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out, _ = layer(x, schedule=schedule, chunks=chunks)
        out.float().square().sum().backward()
        runs.append((schedule, [out, x.grad, layer.router.weight.grad, layer.experts.w1.grad]))
    for i, j in ((0, 2), (1, 3)):
        assert runs[i][0] == runs[j][0]
        assert all(torch.equal(a, b) for a, b in zip(runs[i][1], runs[j][1], strict=True))


def test_zero_tokens_and_leading_dims():
    layer = _single_layer()
    out, aux = layer(torch.zeros(0, 8), schedule="chunked", chunks=4)
    assert out.shape == (0, 8) and float(aux.detach()) == 0.0
    x = torch.randn(2, 3, 8)
    out3, _ = layer(x)
    flat, _ = layer(x.reshape(6, 8))
    assert out3.shape == (2, 3, 8) and torch.equal(out3.reshape(6, 8), flat)
