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

    A one-hot sum rather than ``torch.bincount``: on CUDA bincount reads the max id back to the host
    (a device sync) and this stays on the device; it is exact and deterministic (no atomics).
    """
    ids_E = torch.arange(num_experts, device=experts_N.device)
    return (experts_N.reshape(-1, 1) == ids_E).sum(0)


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
) -> Routing:
    """Route T tokens to K of E experts. See the module docstring for the exact math.

    x_TD: [T, D] any float dtype; w_ED: [E, D]. Returns a frozen :class:`Routing`.
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
    logits_TE = x_TD.float() @ w_ED.float().t()
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
    z_loss = torch.logsumexp(logits_TE, dim=-1).pow(2).mean()
    return Routing(probs_TK, experts_TK, aux_loss, z_loss)


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
