"""Slow single-process references, written from the documented math and nothing else.

Shape legend: T_r tokens of rank r, D hidden, E global experts, F expert ffn size, K top-k.

No dispatcher, no grouped GEMM, no custom autograd: a token-by-token loop in plain torch ops, so its
autograd gradients are an independent check of every fast path. It takes the FULL weights
(``router.weight`` [E, D], ``experts.w1`` [E, D, 2F], ``experts.w2`` [E, F, D]) and one input per EP
rank (routing and the auxiliary losses are per rank, as in the layer).
"""

from __future__ import annotations

import torch


def reference_route(x_TD, w_ED, *, topk, score="softmax", normalize=None, force_balance=False):
    """Returns (probs_TK, experts_TK, aux_loss, z_loss) computed straight from the formulas."""
    num_tokens, num_experts = x_TD.shape[0], w_ED.shape[0]
    normalize = (score == "sigmoid") if normalize is None else normalize
    logits = x_TD.double() @ w_ED.double().t()
    scores = torch.softmax(logits, -1) if score == "softmax" else torch.sigmoid(logits)
    if force_balance:
        experts = torch.tensor([[(t * topk + k) % num_experts for k in range(topk)] for t in range(num_tokens)],
                               dtype=torch.int64).view(num_tokens, topk)
    else:
        # Same choice as the layer: topk of the fp32 scores (ties and near-ties decided identically).
        experts = torch.topk(torch.softmax(x_TD.float() @ w_ED.float().t(), -1) if score == "softmax"
                             else torch.sigmoid(x_TD.float() @ w_ED.float().t()), topk, -1).indices
    probs = scores.gather(1, experts)
    if normalize:
        probs = probs / probs.sum(-1, keepdim=True)
    if num_tokens == 0:
        zero = logits.sum() * 0
        return probs, experts, zero, zero
    load = torch.zeros(num_experts, dtype=torch.float64)
    for e in experts.reshape(-1).tolist():
        load[e] += 1.0 / (num_tokens * topk)
    p_mean = (scores if score == "softmax" else scores / scores.sum(-1, keepdim=True)).mean(0)
    aux = num_experts * (load * p_mean).sum()
    z = torch.logsumexp(logits, -1).pow(2).mean()
    return probs, experts, aux, z


def reference_expert(x_D, w1_D2F, w2_FD):
    ffn = w2_FD.shape[0]
    h = x_D @ w1_D2F
    return (torch.nn.functional.silu(h[:ffn]) * h[ffn:]) @ w2_FD


def reference_moe(xs: list[torch.Tensor], full: dict[str, torch.Tensor], *, topk: int, score="softmax",
                  normalize=None, force_balance=False):
    """Per-rank outputs and losses of the layer, computed in float64 from the full weights.

    xs[r]: rank r's tokens [T_r, D]. Returns (outs[r] [T_r, D] float64, aux[r], z[r]).
    Differentiable with respect to ``xs`` and ``full``.
    """
    w_ED, w1, w2 = full["router.weight"], full["experts.w1"], full["experts.w2"]
    outs, auxes, zs = [], [], []
    for x in xs:
        probs, experts, aux, z = reference_route(x, w_ED, topk=topk, score=score, normalize=normalize,
                                                 force_balance=force_balance)
        rows = []
        for t in range(x.shape[0]):
            acc = torch.zeros(x.shape[1], dtype=torch.float64)
            for k in range(topk):
                e = int(experts[t, k])
                acc = acc + probs[t, k] * reference_expert(x[t].double(), w1[e].double(), w2[e].double())
            rows.append(acc)
        outs.append(torch.stack(rows) if rows else torch.zeros(0, x.shape[1], dtype=torch.float64))
        auxes.append(aux)
        zs.append(z)
    return outs, auxes, zs
