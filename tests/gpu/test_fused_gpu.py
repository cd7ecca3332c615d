"""Fused Triton kernels (ep/fused.py) vs the torch path they replace, on CUDA, bf16.

The kernels do the same fp32 arithmetic; only a sum's order may differ, so outputs agree within
one bf16 rounding (a product of two values, rounded once, must agree bitwise).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _rel(a, b):
    return float((a.detach().double() - b.detach().double()).norm() / b.detach().double().norm())


@cuda
@pytest.mark.parametrize("rows,ffn", [(1, 8), (37, 24), (4096, 768)])
def test_swiglu_matches_torch(rows, ffn, monkeypatch):
    from moe_overlap.ep import experts

    h = torch.randn(rows, 2 * ffn, device="cuda", dtype=torch.bfloat16)
    da = torch.randn(rows, ffn, device="cuda", dtype=torch.bfloat16)
    a, (dh, a2, none) = experts._swiglu(h), experts._swiglu_backward(h, da)
    monkeypatch.setenv("MOE_OVERLAP_FUSED", "0")
    ra, (rdh, ra2, _) = experts._swiglu(h), experts._swiglu_backward(h, da)
    assert none is None
    assert torch.equal(a, a2), "forward and backward must recompute the same activation"
    for got, want in ((a, ra), (dh, rdh), (a2, ra2)):
        assert _rel(got, want) < 4e-3
        assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-6).all()


@cuda
@pytest.mark.parametrize("rows,ffn", [(1, 8), (37, 24), (4096, 768), (300, 2048), (5, 3000)])
def test_swiglu_with_weights_matches_torch(rows, ffn, monkeypatch):
    """Routing weights in the ffn space: the per-row kernel (dprobs summed in fixed order) vs torch."""
    from moe_overlap.ep import experts

    h = torch.randn(rows, 2 * ffn, device="cuda", dtype=torch.bfloat16)
    da = torch.randn(rows, ffn, device="cuda", dtype=torch.bfloat16)
    p = torch.rand(rows, device="cuda")
    a, (dh, a2, dp) = experts._swiglu(h, p), experts._swiglu_backward(h, da, p)
    monkeypatch.setenv("MOE_OVERLAP_FUSED", "0")
    ra, (rdh, ra2, rdp) = experts._swiglu(h, p), experts._swiglu_backward(h, da, p)
    assert torch.equal(a, a2), "forward and backward must recompute the same activation"
    assert dp.dtype == torch.float32 and dp.shape == (rows,)
    for got, want in ((a, ra), (dh, rdh), (a2, ra2)):
        assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-6).all()
    torch.testing.assert_close(dp, rdp, rtol=1e-4, atol=1e-4 * ffn ** 0.5)


@cuda
@pytest.mark.parametrize("tokens,topk,experts_n,dim", [(3, 1, 2, 8), (257, 8, 16, 2048), (64, 6, 32, 7168)])
def test_unpermute_matches_torch(tokens, topk, experts_n, dim, monkeypatch):
    from moe_overlap.ep import dispatcher as dp

    gen = torch.Generator().manual_seed(tokens)
    ex = torch.stack([torch.randperm(experts_n, generator=gen)[:topk] for _ in range(tokens)]).cuda()
    plan = dp.plan_permute(ex, experts_n)
    assert plan.tokens_per_expert_E.tolist() == torch.bincount(ex.flatten(), minlength=experts_n).tolist()
    y = torch.randn(tokens * topk, dim, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    p = torch.rand(tokens, topk, device="cuda")
    got = (dp.unpermute_rows(y, p, plan), *dp.unpermute_rows_backward(g, y, p, plan), dp.permute_rows_backward(y, plan))
    monkeypatch.setenv("MOE_OVERLAP_FUSED", "0")
    want = (dp.unpermute_rows(y, p, plan), *dp.unpermute_rows_backward(g, y, p, plan), dp.permute_rows_backward(y, plan))
    assert torch.equal(got[1], want[1]), "g_ND is one product rounded once: bitwise"
    for a, b in zip(got, want, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert _rel(a, b) < 4e-3


@cuda
@pytest.mark.parametrize("tokens,topk,experts_n,dim", [(3, 1, 2, 8), (257, 8, 16, 2048), (64, 6, 32, 7168),
                                                       (50, 2, 4, 1000)])
def test_row_gather_and_unweighted_unpermute_match_torch(tokens, topk, experts_n, dim, monkeypatch):
    """The permute gather (a copy: bitwise) and the EP 1 combine (weights applied by the experts): its
    backward is that gather of g, its forward the fused unweighted sum."""
    from moe_overlap.ep import dispatcher as dp

    gen = torch.Generator().manual_seed(tokens)
    ex = torch.stack([torch.randperm(experts_n, generator=gen)[:topk] for _ in range(tokens)]).cuda()
    plan = dp.plan_permute(ex, experts_n)
    x = torch.randn(tokens, dim, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(tokens * topk, dim, device="cuda", dtype=torch.bfloat16)
    got = (dp.permute_rows(x, plan), dp.unpermute_rows(y, None, plan), dp.unpermute_rows_backward(x, None, None, plan))
    monkeypatch.setenv("MOE_OVERLAP_FUSED", "0")
    want = (dp.permute_rows(x, plan), dp.unpermute_rows(y, None, plan), dp.unpermute_rows_backward(x, None, None, plan))
    assert torch.equal(got[0], want[0]) and torch.equal(got[2][0], want[2][0]) and got[2][1] is None
    assert torch.equal(got[0], x.index_select(0, plan.token_N))
    assert _rel(got[1], want[1]) < 4e-3
    from moe_overlap.ep import fused

    p = torch.rand(tokens * topk, device="cuda")
    assert torch.equal(fused.gather_1d(p, plan.perm_N), p.index_select(0, plan.perm_N))


@cuda
@pytest.mark.parametrize("tokens,topk,experts_n", [(1, 1, 2), (257, 8, 16), (4096, 8, 128), (3000, 6, 256)])
def test_permute_plan_kernel_equals_sort(tokens, topk, experts_n, monkeypatch):
    """fused_index.permute_plan: bitwise the stable sort's plan (integers), skewed routing included."""
    from moe_overlap.ep import dispatcher as dp

    gen = torch.Generator().manual_seed(tokens)
    ex = torch.stack([torch.randperm(experts_n, generator=gen)[:topk] for _ in range(tokens)]).cuda()
    ex[: tokens // 2, 0] = experts_n - 1  # half the tokens pick the last expert first: uneven groups
    got = dp.plan_permute(ex, experts_n)
    monkeypatch.setenv("MOE_OVERLAP_FUSED", "0")
    want = dp.plan_permute(ex, experts_n)
    for name in ("perm_N", "inv_perm_N", "token_N", "tokens_per_expert_E"):
        a, b = getattr(got, name), getattr(want, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name


@cuda
@pytest.mark.parametrize("counts", [[[3, 0, 2], [1, 4, 0]], [[0, 0], [0, 0]], [[2000, 1], [0, 1500], [7, 7]],
                                    [[(i * 37) % 300 for i in range(64)], [(i * 11) % 290 for i in range(64)]]])
def test_block_transpose_kernel_equals_torch(counts):
    from moe_overlap.ep import counts as cn
    from moe_overlap.ep import fused_index

    t = torch.tensor(counts, device="cuda")
    total = int(t.sum())
    sort_idx, unsort_idx = fused_index.block_transpose_indices(counts, torch.device("cuda"))
    assert torch.equal(sort_idx, cn.block_transpose_index(t, total))
    assert torch.equal(unsort_idx, cn.block_transpose_index(t.t(), total))


@cuda
@pytest.mark.parametrize("tokens,dim,experts_n", [(5, 16, 4), (4096, 7168, 32), (4096, 2048, 128)])
def test_router_logits_backward_bf16_matches_fp32(tokens, dim, experts_n):
    """router._Logits: tensor-core forward and split-precision backward vs autograd on fp32 copies."""
    from moe_overlap.ep.router import router_logits

    gen = torch.Generator(device="cuda").manual_seed(dim)
    x = torch.randn(tokens, dim, device="cuda", generator=gen).bfloat16().requires_grad_()
    w = (torch.randn(experts_n, dim, device="cuda", generator=gen) / dim ** 0.5).bfloat16().requires_grad_()
    g = torch.randn(tokens, experts_n, device="cuda", generator=gen) * 1e-3
    x32, w32 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    out = router_logits(x, w)
    out.backward(g)
    ref = x32 @ w32.t()
    ref.backward(g.double())
    assert out.dtype == torch.float32 and _rel(out, ref) < 1e-5
    # One rounding to bf16 of a result computed with ~16-bit inputs and fp32 sums: within bf16 rounding.
    for got, want in ((x.grad, x32.grad), (w.grad, w32.grad)):
        assert got.dtype == torch.bfloat16 and _rel(got, want) < 4e-3
        assert ((got.double() - want).abs() <= 2 ** -7 * want.abs() + 1e-9 * want.abs().max()).float().mean() > 0.999
