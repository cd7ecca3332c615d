"""A bias-free linear layer whose backward splits dgrad from wgrad, so wgrad can be delayed.

Shape legend: ... leading dims, I in features, O out features, M = prod(...) rows.

    y[..., O] = x[..., I] @ w[O, I].T
    dgrad: dx = dy @ w                       (returned at once: the previous node waits for it)
    wgrad: dw = dy_MO.T @ x_MI               (returned to autograd, or deferred into a WgradStore)

The attention projections use it with the same store as the experts (Megatron-Core's
`delay_wgrad_compute` also delays the attention wgrad: `attn.backward_dw()`). Both paths compute dw
with the same GEMM and the store accumulates like autograd (wgrad.accumulate_grad), so delayed and
immediate wgrad give bitwise the same `.grad`; the sequential schedule uses this function too.
"""

from __future__ import annotations

import torch

from moe_overlap.ep.wgrad import WgradStore, accumulate_grad


def _wgrad(x, dy) -> torch.Tensor:
    return dy.reshape(-1, dy.shape[-1]).t() @ x.reshape(-1, x.shape[-1])


class _SplitLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, store):
        ctx.save_for_backward(x)
        # The Parameter itself (not a saved copy): a deferred closure accumulates into its .grad.
        ctx.weight, ctx.store = weight, store
        return x @ weight.t()

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        weight, store = ctx.weight, ctx.store
        dx = dy @ weight.detach()
        if not ctx.needs_input_grad[1]:
            return dx, None, None
        if store is None:
            return dx, _wgrad(x, dy), None
        store.defer(lambda: accumulate_grad(weight, _wgrad(x, dy)))
        return dx, None, None


def split_linear(x: torch.Tensor, weight: torch.Tensor, store: WgradStore | None = None) -> torch.Tensor:
    """x [..., I] @ weight[O, I].T -> [..., O]; with `store`, weight's gradient is deferred into it."""
    return _SplitLinear.apply(x, weight, store)
