"""Top-k token routing: scores, top-k choice, routing weights, auxiliary losses.

Shape legend: T local tokens, D hidden, E global experts, K top-k.

The math (anyone can recompute it from ``router.weight``):

    logits_TE = (x_TD @ w_ED.T) in fp32          (x and w cast to fp32 first)
    softmax:  scores_TE = softmax(logits_TE, -1)
    sigmoid:  scores_TE = sigmoid(logits_TE)
    experts_TK = indices of the K largest scores per token (torch.topk order: largest first)
    probs_TK   = scores_TE gathered at experts_TK
    if normalize (default: False for softmax, True for sigmoid): probs_TK /= probs_TK.sum(-1) (+1e-20)

force_balance=True replaces the top-k choice (not the scores) by the deterministic balanced assignment
``experts_TK[t, k] = (t * K + k) % E``: K distinct experts per token, every expert gets T*K/E rows
(+-1). Benchmarks use it so that timings do not depend on random routing skew.

Auxiliary losses (computed over the T local tokens of this rank; 0 when T == 0):

    Switch load balancing: aux = E * sum_e f_e * P_e, with f_e = (rows routed to e) / (T * K) (no gradient)
                           and P_e = mean_t scores_TE[t, e] (normalised per token for sigmoid)
    z-loss:                z = mean_t logsumexp(logits_TE[t])**2

Routing is dropless: there is no capacity and no token is ever dropped.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

SCORE_FUNCTIONS = ("softmax", "sigmoid")


@dataclass(frozen=True)
class Routing:
    """Result of :func:`route`.

    probs_TK:   fp32 routing weights (carry the gradient back to the router weight)
    experts_TK: int64 global expert ids
    aux_loss:   fp32 scalar Switch load-balancing loss (unscaled)
    z_loss:     fp32 scalar router z-loss (unscaled)
    """

    probs_TK: torch.Tensor
    experts_TK: torch.Tensor
    aux_loss: torch.Tensor
    z_loss: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.experts_TK.shape[0]

    @property
    def topk(self) -> int:
        return self.experts_TK.shape[1]


def check_topk(topk: int, num_experts: int) -> None:
    if not isinstance(topk, int) or topk < 1 or topk > num_experts:
        raise ValueError(f"topk={topk!r}: must be an int in [1, num_experts={num_experts}]")


def count_per_expert(experts_N: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [E] counts of each expert id in ``experts_N``.

    A scatter-add of ones rather than ``torch.bincount``: on CUDA bincount reads the max id back to the
    host (a device sync); this stays on the device, in one kernel (a one-hot [N, E] compare and sum took
    six). Integer additions commute, so the atomics give the exact same counts in any order.
    """
    flat = experts_N.reshape(-1)
    return torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))


class _Logits(torch.autograd.Function):
    """logits_TE = x_TD @ w_ED.T in fp32, for bf16/fp16 inputs on CUDA: one tensor-core GEMM with fp32
    accumulation and fp32 output (``torch.mm(..., out_dtype=float32)``). Products of two bf16/fp16
    numbers are exact in fp32, so this is the fp32 GEMM of the upcast inputs up to summation order,
    without writing the upcast [T, D] copy or running the fp32 GEMM (no tensor cores).

    Backward (bf16), the same way: the fp32 gradient g_TE is split into two bf16 numbers,
    g = hi + lo (hi = g rounded, lo = the rest rounded: ~16 significant bits together, against fp32's 24
    and the 8 of the bf16 result), and [hi | lo] is multiplied on the tensor cores with fp32 accumulation,
    so neither the fp32 [T, D] upcast of x nor an fp32 GEMM runs. g_x = [hi | lo] @ [w ; w] comes out in
    x's dtype directly (one rounding, as before); g_w sums the two halves of [hi | lo].T @ x in fp32.
    At the DeepSeek-V3 shape (EP 1, H200) the layer's non-GEMM kernels fell from 1.54 to 1.25 ms: the fp32
    GEMM (0.09 ms) and three casts (0.10 ms) are gone (benchmarks/gpu/gpu_layer.py profiles in
    benchmarks/results/h200x2_2026-11-29_r3/gpu_layer_eb22b3b.json and gpu_layer_after_router.json)."""

    @staticmethod
    def forward(ctx, x_TD, w_ED):
        ctx.save_for_backward(x_TD, w_ED)
        return torch.mm(x_TD, w_ED.t(), out_dtype=torch.float32)

    @staticmethod
    def backward(ctx, g_TE):
        x_TD, w_ED = ctx.saved_tensors
        if x_TD.dtype != torch.bfloat16:
            # fp16's narrow exponent would flush small gradients in the split: the fp32 GEMMs instead.
            g_x = (g_TE @ w_ED.float()).to(x_TD.dtype) if ctx.needs_input_grad[0] else None
            g_w = (g_TE.t() @ x_TD.float()).to(w_ED.dtype) if ctx.needs_input_grad[1] else None
            return g_x, g_w
        hi_TE = g_TE.to(x_TD.dtype)
        g2_T2E = torch.cat([hi_TE, (g_TE - hi_TE.float()).to(x_TD.dtype)], dim=1)  # [hi | lo]
        g_x = torch.mm(g2_T2E, torch.cat([w_ED, w_ED])) if ctx.needs_input_grad[0] else None
        g_w = None
        if ctx.needs_input_grad[1]:
            g_w = torch.mm(g2_T2E.t(), x_TD, out_dtype=torch.float32).view(2, *w_ED.shape).sum(0).to(w_ED.dtype)
        return g_x, g_w


def router_logits(x_TD: torch.Tensor, w_ED: torch.Tensor) -> torch.Tensor:
    """fp32 [T, E] logits; see :class:`_Logits` for the bf16/fp16 CUDA path."""
    if (x_TD.is_cuda and x_TD.dtype == w_ED.dtype and x_TD.dtype in (torch.bfloat16, torch.float16)
            and _mm_out_dtype_works()):
        return _Logits.apply(x_TD, w_ED)
    return x_TD.float() @ w_ED.float().t()


@functools.cache
def _mm_out_dtype_works() -> bool:
    """``torch.mm(out_dtype=...)`` exists on CUDA from torch 2.8; probed once."""
    try:
        a = torch.ones(2, 2, device="cuda", dtype=torch.bfloat16)
        return torch.mm(a, a, out_dtype=torch.float32).dtype == torch.float32
    except (TypeError, RuntimeError, NotImplementedError):
        return False


def balanced_assignment(num_tokens: int, topk: int, num_experts: int, device) -> torch.Tensor:
    """experts_TK[t, k] = (t*K + k) % E: distinct experts per token, loads within +-1 of each other."""
    flat = torch.arange(num_tokens * topk, device=device, dtype=torch.int64) % num_experts
    return flat.view(num_tokens, topk)


def route(
    x_TD: torch.Tensor,
    w_ED: torch.Tensor,
    *,
    topk: int,
    score: str = "softmax",
    normalize: bool | None = None,
    force_balance: bool = False,
    z_loss: bool = True,
) -> Routing:
    """Route T tokens to K of E experts. See the module docstring for the exact math.

    x_TD: [T, D] any float dtype; w_ED: [E, D]. Returns a frozen :class:`Routing`. ``z_loss=False``
    skips the z-loss (its field is then a zero without a graph): layers with a zero z-loss coefficient
    save its logsumexp and its backward.
    """
    if score not in SCORE_FUNCTIONS:
        raise ValueError(f"score={score!r}: must be one of {SCORE_FUNCTIONS}")
    if x_TD.dim() != 2 or w_ED.dim() != 2:
        raise ValueError(f"x_TD and w_ED must be 2-D, got shapes {tuple(x_TD.shape)} and {tuple(w_ED.shape)}")
    if x_TD.shape[1] != w_ED.shape[1]:
        raise ValueError(f"x_TD hidden size {x_TD.shape[1]} != router weight hidden size {w_ED.shape[1]}")
    num_experts = w_ED.shape[0]
    check_topk(topk, num_experts)
    if normalize is None:
        normalize = score == "sigmoid"

    # Routing decisions are precision-sensitive (ties, near-ties): always score in fp32.
    logits_TE = router_logits(x_TD, w_ED)
    scores_TE = torch.softmax(logits_TE, dim=-1) if score == "softmax" else torch.sigmoid(logits_TE)
    num_tokens = x_TD.shape[0]
    if force_balance:
        experts_TK = balanced_assignment(num_tokens, topk, num_experts, x_TD.device)
    else:
        experts_TK = torch.topk(scores_TE, topk, dim=-1).indices
    probs_TK = scores_TE.gather(1, experts_TK)
    if normalize:
        probs_TK = probs_TK / (probs_TK.sum(-1, keepdim=True) + 1e-20)

    if num_tokens == 0:
        zero = logits_TE.sum() * 0.0  # keeps the graph connected, value exactly 0
        return Routing(probs_TK, experts_TK, zero, zero)
    frac_E = count_per_expert(experts_TK.reshape(-1), num_experts).float() / (num_tokens * topk)
    score_for_aux = scores_TE if score == "softmax" else scores_TE / (scores_TE.sum(-1, keepdim=True) + 1e-20)
    aux_loss = num_experts * (frac_E * score_for_aux.mean(0)).sum()
    z = torch.logsumexp(logits_TE, dim=-1).pow(2).mean() if z_loss else torch.zeros((), device=x_TD.device)
    return Routing(probs_TK, experts_TK, aux_loss, z)


class AttachLoss(torch.autograd.Function):
    """out = x in forward; in backward, also sends ``coeff`` as the gradient of ``loss``.

    This is how an auxiliary loss reaches the router without the caller adding it to the objective
    (Megatron-Core does the same): d(objective)/d(loss) == coeff.
    """

    @staticmethod
    def forward(ctx, x, loss, coeff: float):
        ctx.coeff = coeff
        ctx.loss_meta = (loss.dtype, loss.device)
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad_x):
        dtype, device = ctx.loss_meta
        return grad_x, torch.full((), ctx.coeff, dtype=dtype, device=device), None


def attach_aux_losses(out: torch.Tensor, routing: Routing, aux_coeff: float, z_coeff: float) -> torch.Tensor:
    """Return ``out`` unchanged but with the router losses' gradients attached (no-op for zero coeffs)."""
    if aux_coeff:
        out = AttachLoss.apply(out, routing.aux_loss, float(aux_coeff))
    if z_coeff:
        out = AttachLoss.apply(out, routing.z_loss, float(z_coeff))
    return out
