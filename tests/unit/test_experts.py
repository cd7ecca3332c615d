"""Grouped SwiGLU experts: math, explicit backward, deferred wgrad, both GEMM paths (moe_overlap.ep.experts)."""

import pytest
import torch

from moe_overlap.ep.experts import GroupedExperts, expert_path, grouped_mm_supported
from moe_overlap.ep.wgrad import WgradStore


def _naive(x, w1, w2, counts):
    ffn = w2.shape[1]
    out, start = [], 0
    for e, c in enumerate(counts):
        rows = x[start:start + c]
        h = rows @ w1[e]
        out.append((torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:]) @ w2[e])
        start += c
    return torch.cat(out)


def _make(d, f, counts, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    ex = GroupedExperts(len(counts), d, f, dtype=dtype)
    with torch.no_grad():
        ex.w1.copy_(torch.randn(ex.w1.shape, generator=g) * 0.3)
        ex.w2.copy_(torch.randn(ex.w2.shape, generator=g) * 0.3)
    x = torch.randn(sum(counts), d, generator=g).to(dtype)
    return ex, x


# (8, 8) is 16-byte aligned in fp32 -> grouped_mm on this torch; (6, 3) is not -> the loop.
@pytest.mark.parametrize("d,f,path", [(8, 8, "grouped_mm"), (6, 3, "loop")])
@pytest.mark.parametrize("counts", [(3, 0, 5), (0, 0, 4), (2, 2, 2), (0, 0, 0)])
def test_forward_backward_match_autograd_of_naive_math(d, f, path, counts):
    ex, x = _make(d, f, counts)
    if path == "grouped_mm" and not grouped_mm_supported("cpu", torch.float32):
        pytest.skip("torch._grouped_mm unavailable on this CPU build")
    assert ex.path_for(x) == path
    x1 = x.clone().requires_grad_()
    y = ex(x1, counts)
    w1 = ex.w1.detach().clone().requires_grad_()
    w2 = ex.w2.detach().clone().requires_grad_()
    x2 = x.clone().requires_grad_()
    y_ref = _naive(x2, w1, w2, counts) if sum(counts) else x2.new_zeros(0, d)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-6)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    (y * gy).sum().backward()
    if sum(counts):
        (y_ref * gy).sum().backward()
        torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ex.w1.grad, w1.grad, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ex.w2.grad, w2.grad, rtol=1e-5, atol=1e-6)
    for e, c in enumerate(counts):  # an expert without rows gets an exact zero gradient
        if c == 0:
            assert not ex.w1.grad[e].any() and not ex.w2.grad[e].any()


@pytest.mark.parametrize("d,f,path", [(8, 8, "grouped_mm"), (6, 3, "loop")])
@pytest.mark.parametrize("counts", [(3, 0, 5), (2, 2, 2), (0, 0, 0)])
def test_routing_weights_in_ffn_space_match_autograd(d, f, path, counts):
    """probs_S: y = (silu(gate) * up * p) @ w2 per row; every gradient, the weights' included, from autograd
    of that naive math in float64."""
    ex, x = _make(d, f, counts)
    if path == "grouped_mm" and not grouped_mm_supported("cpu", torch.float32):
        pytest.skip("torch._grouped_mm unavailable on this CPU build")
    p = torch.rand(sum(counts), generator=torch.Generator().manual_seed(2)) + 0.1
    x1, p1 = x.clone().requires_grad_(), p.clone().requires_grad_()
    y = ex(x1, counts, probs_S=p1)
    w1 = ex.w1.detach().double().requires_grad_()
    w2 = ex.w2.detach().double().requires_grad_()
    x2, p2 = x.double().requires_grad_(), p.double().requires_grad_()
    ffn, pieces, start = f, [], 0
    for e, c in enumerate(counts):
        h = x2[start:start + c] @ w1[e]
        pieces.append((torch.nn.functional.silu(h[:, :ffn]) * h[:, ffn:] * p2[start:start + c, None]) @ w2[e])
        start += c
    y_ref = torch.cat(pieces) if pieces else x2.new_zeros(0, d)
    torch.testing.assert_close(y.double(), y_ref, rtol=1e-5, atol=1e-6)
    gy = torch.randn(y.shape, generator=torch.Generator().manual_seed(1))
    (y * gy).sum().backward()
    if sum(counts):
        (y_ref * gy.double()).sum().backward()
        for got, want in ((x1.grad, x2.grad), (p1.grad, p2.grad), (ex.w1.grad, w1.grad), (ex.w2.grad, w2.grad)):
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="probs_S: shape"):
        ex(x, counts, probs_S=torch.ones(sum(counts) + 1))


def test_deferred_wgrad_is_bitwise_the_immediate_one():
    counts = (4, 1, 0, 3)
    ex, x = _make(8, 8, counts)
    gy = torch.randn(8, 8, generator=torch.Generator().manual_seed(2))
    (ex(x, counts) * gy).sum().backward()
    want1, want2 = ex.w1.grad.clone(), ex.w2.grad.clone()
    ex.w1.grad = ex.w2.grad = None
    store = WgradStore()
    xg = x.clone().requires_grad_()
    (ex(xg, counts, wgrad_store=store) * gy).sum().backward()
    assert xg.grad is not None and ex.w1.grad is None and store.pending == 1
    assert store.run_all() == 1 and store.pending == 0
    assert torch.equal(ex.w1.grad, want1) and torch.equal(ex.w2.grad, want2)


def test_same_inputs_bitwise_same_outputs():
    counts = (5, 0, 3)
    ex, x = _make(8, 8, counts)
    assert torch.equal(ex(x, counts), ex(x, counts))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_close_to_fp32(dtype):
    counts = (3, 2, 3)
    ex, x = _make(16, 16, counts)
    want = ex(x, counts).detach()
    ex_lp = ex.to(dtype)
    got = ex_lp(x.to(dtype), counts)
    assert got.dtype == dtype
    assert expert_path(x.to(dtype), ex_lp.w1, ex_lp.w2) in ("grouped_mm", "loop")
    torch.testing.assert_close(got.float(), want, rtol=5e-2, atol=5e-2)


def test_bad_inputs():
    with pytest.raises(ValueError, match="dtype=torch.float64"):
        GroupedExperts(2, 8, 8, dtype=torch.float64)
    ex, x = _make(8, 8, (2, 2))
    with pytest.raises(ValueError, match=r"tokens_per_expert=\(3, 2\)"):
        ex(x, (3, 2))
    with pytest.raises(ValueError, match="x dtype"):
        ex(x.double(), (2, 2))
    with pytest.raises(ValueError, match="hidden=8"):
        ex(x[:, :4], (2, 2))
