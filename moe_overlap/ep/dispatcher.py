"""Token dispatcher over an explicit process group: permute, all-to-all, sort; and back.

Shape legend: T local tokens, K top-k, N = T*K routed rows sent by this rank, S rows received by this
rank (for its local experts), D hidden, E global experts, L = E / R local experts, R ranks in the group.

Global expert e lives on rank e // L as local expert e % L.

Forward (dispatch):
  1. permute:  x_ND[i] = x_TD[perm_N[i] // K], perm_N = stable argsort of experts_TK.flatten(); rows for
               rank r are then contiguous (sorted by global expert), send_splits[r] = their count.
  2. counts:   the per-expert counts are exchanged and the plan built (counts.py: the layer's one
               device-to-host sync at EP > 1; none at EP 1).
  3. all-to-all: received rows are grouped by (source rank, local expert).
  4. sort_by_local_expert: regroup them by (local expert, source rank), the layout grouped GEMMs want.
Combine is the exact inverse (unsort, reverse all-to-all, unpermute) and applies the routing weights:
  out_TD[t] = sum_k probs_TK[t, k] * y(t, k)        (in fp32, cast back to y's dtype)
Where the rows never leave the rank (one-rank group: EP 1) the weights go to the experts instead, permuted
like the rows (``permute_weights``), and are applied in the ffn space (experts.py): the combine then only
sums, and its backward is a gather of the output gradient rather than a pass that also reads y [N, D]
(measured in benchmarks/gpu/gpu_layer.py). At EP > 1 they stay here: moving them would add an all-to-all.

Every step is a gather by a permutation, so every backward is a gather by the inverse permutation
plus a fixed-order sum over K: deterministic on CPU and GPU (no scatter-add, no atomics).

``dispatch``/``combine`` are autograd-aware and synchronous. Schedules use the plain steps below
(``plan_permute``, ``permute_rows``, counts.py's ``start_count_exchange`` / ``plan_for``,
``all_to_all_async``, ``sort_rows``, ``unpermute_rows`` and their ``*_backward``) to start and wait each
piece separately.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fused, fused_index
from . import sync_free as sf
from .all_to_all import all_to_all, all_to_all_equal, group_size
from .counts import DispatchPlan, PermutePlan, plan_for
from .router import Routing


@dataclass(frozen=True)
class DispatchHandle:
    """What ``combine`` needs from ``dispatch``; frozen, nothing else is kept anywhere."""

    plan: DispatchPlan
    probs_TK: torch.Tensor | None  # weights the combine applies; None when the experts apply them
    group: object
    transport: object = None  # transport.py copy engines, or None for the group's own all-to-all
    probs_S: torch.Tensor | None = None  # [S] weights of the received rows, for the experts (EP 1), or None


# ---------------------------------------------------------------- permute (plain steps)
def plan_permute(experts_TK: torch.Tensor, num_experts: int) -> PermutePlan:
    num_tokens, topk = experts_TK.shape
    if fused.available(experts_TK):  # the same integers from one launch instead of ~8 host ops
        perm_N, inv_perm_N, token_N, counts_E = fused_index.permute_plan(experts_TK, num_experts)
        return PermutePlan(perm_N, inv_perm_N, token_N, counts_E, num_tokens, topk)
    flat_N = experts_TK.reshape(-1)
    sorted_N, perm_N = torch.sort(flat_N, stable=True)
    inv_perm_N = torch.empty_like(perm_N)
    inv_perm_N[perm_N] = torch.arange(perm_N.numel(), device=perm_N.device)
    # Counts from the sorted ids: torch.bincount on CUDA reads the max id back to the host (a hidden
    # host sync); searchsorted over the sorted ids gives the same counts without one.
    edges = torch.searchsorted(sorted_N, torch.arange(num_experts + 1, device=flat_N.device, dtype=flat_N.dtype))
    counts_E = edges.diff()
    return PermutePlan(perm_N, inv_perm_N, perm_N // topk, counts_E, num_tokens, topk)


def permute_rows(x_TD: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    # index_select's gather ran at 3.1-3.2 TB/s on an H200; a Triton row gather was no faster (0.171 vs
    # 0.166 ms at the DeepSeek-V3 shape) and cost more host time per launch (benchmarks/gpu/gpu_layer.py, permute).
    return x_TD.index_select(0, plan.token_N)


def permute_rows_backward(g_ND: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    if fused.available(g_ND):  # gather + fp32 sum over K in one pass (no [T, K, D] intermediate)
        return fused.weighted_gather_sum(g_ND, plan.inv_perm_N, None, plan.num_tokens, plan.topk)
    g_TKD = g_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, g_ND.shape[1])
    return g_TKD.sum(1)


def unpermute_rows(y_ND: torch.Tensor, probs_TK: torch.Tensor | None, plan: PermutePlan) -> torch.Tensor:
    """out[t] = sum_k probs[t, k] * y(t, k) in fp32 (probs None: an unweighted sum), in y's dtype."""
    if fused.available(y_ND):  # same fp32 math, one read of y and one write of out (fused.py)
        p = None if probs_TK is None else probs_TK.float()
        return fused.weighted_gather_sum(y_ND, plan.inv_perm_N, p, plan.num_tokens, plan.topk)
    y_TKD = y_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, y_ND.shape[1])
    if probs_TK is None:
        return y_TKD.float().sum(1).to(y_ND.dtype)
    # Weighted sum in fp32 so bf16/fp16 results do not depend on K's rounding order.
    return (probs_TK.float().unsqueeze(-1) * y_TKD.float()).sum(1).to(y_ND.dtype)


def unpermute_rows_backward(g_TD, y_ND, probs_TK, plan: PermutePlan):
    """Returns (g_ND, g_probs_TK) for ``unpermute_rows``; unweighted (probs None): (g_TD[token_N], None)."""
    if probs_TK is None:  # y(t, k) entered the sum unweighted: each row's gradient is its token's
        return permute_rows(g_TD, plan), None
    if fused.available(y_ND):
        g_ND, g_probs = fused.weighted_gather_sum_backward(g_TD, y_ND, plan.inv_perm_N, probs_TK.float())
        return g_ND, g_probs.to(probs_TK.dtype)
    y_TKD = y_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, y_ND.shape[1]).float()
    g32_T1D = g_TD.float().unsqueeze(1)
    g_probs_TK = (g32_T1D * y_TKD).sum(-1).to(probs_TK.dtype)
    g_TKD = (probs_TK.float().unsqueeze(-1) * g32_T1D).to(y_ND.dtype)
    g_ND = g_TKD.reshape(plan.num_tokens * plan.topk, y_ND.shape[1]).index_select(0, plan.perm_N)
    return g_ND, g_probs_TK


def _gather_1d(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    return fused.gather_1d(src, idx) if fused.available(src) else src.index_select(0, idx)


def permute_weights(probs_TK: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    """The routing weights in the rows' order, probs_N[i] = probs_TK.flatten()[perm_N[i]] (EP 1: for the experts)."""
    return _gather_1d(probs_TK.reshape(-1), plan.perm_N)


def permute_weights_backward(g_probs_N: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    """Gradient of :func:`permute_weights`: back to [T, K] by the inverse permutation."""
    return _gather_1d(g_probs_N, plan.inv_perm_N).view(plan.num_tokens, plan.topk)


def _sort_is_identity(plan: DispatchPlan) -> bool:
    """One source rank: (source, local expert) order already is (local expert, source) order."""
    return len(plan.recv_splits) == 1


def sort_rows(recv_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    # The identity sort (EP 1) is skipped: a gather by arange would copy [S, D] for nothing.
    return recv_SD if _sort_is_identity(plan) else recv_SD.index_select(0, plan.sort_idx_S)


def unsort_rows(y_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    return y_SD if _sort_is_identity(plan) else y_SD.index_select(0, plan.unsort_idx_S)


# ---------------------------------------------------------------- autograd wrappers
class _PermuteFn(torch.autograd.Function):
    """x_ND = x_TD[token_N]; with probs_TK also probs_N = probs_TK.flatten()[perm_N] (the rows' weights, for
    experts that apply them), in the same autograd node: one node fewer to issue per layer and step."""

    @staticmethod
    def forward(ctx, x_TD, probs_TK, plan):
        ctx.plan = plan
        x_ND = permute_rows(x_TD, plan)
        return x_ND, None if probs_TK is None else permute_weights(probs_TK, plan)

    @staticmethod
    def backward(ctx, g_ND, g_probs_N):
        g_probs = None if g_probs_N is None else permute_weights_backward(g_probs_N, ctx.plan)
        return permute_rows_backward(g_ND, ctx.plan), g_probs, None


class _GatherPermFn(torch.autograd.Function):
    """x[idx] for a permutation idx; backward is the gather by the inverse permutation."""

    @staticmethod
    def forward(ctx, x, idx, inv_idx):
        ctx.save_for_backward(inv_idx)
        return x.index_select(0, idx)

    @staticmethod
    def backward(ctx, g):
        (inv_idx,) = ctx.saved_tensors
        return g.index_select(0, inv_idx), None, None


class _UnpermuteFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y_ND, probs_TK, plan):
        ctx.plan = plan
        # Unweighted, the backward is a gather of g alone: y is not kept alive for it.
        ctx.save_for_backward(*(() if probs_TK is None else (y_ND, probs_TK)))
        return unpermute_rows(y_ND, probs_TK, plan)

    @staticmethod
    def backward(ctx, g_TD):
        y_ND, probs_TK = ctx.saved_tensors or (None, None)
        g_ND, g_probs = unpermute_rows_backward(g_TD, y_ND, probs_TK, ctx.plan)
        return g_ND, g_probs, None


def unpermute(y_ND: torch.Tensor, probs_TK: torch.Tensor | None, plan: PermutePlan) -> torch.Tensor:
    """Autograd-aware inverse of :func:`permute` applying the routing weights (None: already applied) -> out_TD."""
    return _UnpermuteFn.apply(y_ND, probs_TK, plan)


def permute(x_TD: torch.Tensor, routing: Routing, num_experts: int, *, with_probs: bool = False):
    """Autograd-aware step 1. Returns (x_ND sorted by global expert, plan), or with ``with_probs``
    (x_ND, probs_N, plan): the routing weights in the rows' order too, for experts that apply them (EP 1)."""
    plan = plan_permute(routing.experts_TK, num_experts)
    x_ND, probs_N = _PermuteFn.apply(x_TD, routing.probs_TK if with_probs else None, plan)
    return (x_ND, probs_N, plan) if with_probs else (x_ND, plan)


def sort_by_local_expert(recv_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Autograd-aware step 4: (source, local expert) order -> (local expert, source) order."""
    if _sort_is_identity(plan):
        return recv_SD
    return _GatherPermFn.apply(recv_SD, plan.sort_idx_S, plan.unsort_idx_S)


def unsort_by_local_expert(y_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    if _sort_is_identity(plan):
        return y_SD
    return _GatherPermFn.apply(y_SD, plan.unsort_idx_S, plan.sort_idx_S)


def dispatch(x_TD: torch.Tensor, routing: Routing, *, num_experts: int, group, counts_group=None,
             transport=None, sync_free: bool = False, capacity: int | None = None):
    """Synchronous, autograd-aware dispatch.

    Returns ``(recv_x_SD, tokens_per_local_expert, handle)``: rows grouped by local expert, their counts
    (a tuple of host ints summing to S; at EP 1 on CUDA the int64 device tensor, see counts.py), and the
    frozen :class:`DispatchHandle` that :func:`combine` consumes; pass ``handle.probs_S`` to the experts
    (None at EP > 1, where the combine applies the weights). ``counts_group``: a host (gloo) group
    for the count exchange (counts.py), None to use ``group``; ``transport``: transport.py copy engines
    instead of the group's all-to-all (None). ``sync_free``: the host-sync-free path of sync_free.py (counts
    and splits on the device, equal-block all-to-alls of P = ``capacity`` or tokens * topk rows per peer; the
    counts returned are a device tensor), at any group size, the default path's results bit for bit.
    """
    if sync_free:
        sf.check_usable(transport)
        x_ND, pplan = permute(x_TD, routing, num_experts)
        kept_RL, counts = sf.start_counts(pplan, num_experts, group, capacity)
        plan = sf.build_plan(pplan, sf.send_side(pplan, kept_RL, capacity), counts.wait())
        recv_BD = all_to_all_equal(sf.pad_send_fn(x_ND, plan), group)
        recv_BD = sf.compact_fn(recv_BD, plan)
        return recv_BD, plan.tokens_per_local_expert, DispatchHandle(plan, routing.probs_TK, group)
    if group_size(group) == 1:
        # One rank: the all-to-all is the identity (skipped; its autograd wrapper would copy [N, D]), and
        # the rows are the experts' rows in order: their weights go to the experts (module docstring).
        x_ND, probs_S, pplan = permute(x_TD, routing, num_experts, with_probs=True)
        plan = plan_for(pplan, num_experts, group, counts_group=counts_group)
        return x_ND, plan.tokens_per_local_expert, DispatchHandle(plan, None, group, transport, probs_S)
    x_ND, pplan = permute(x_TD, routing, num_experts)
    plan = plan_for(pplan, num_experts, group, counts_group=counts_group)
    x_ND = all_to_all(x_ND, plan.recv_splits, plan.send_splits, group, transport)
    recv_SD = sort_by_local_expert(x_ND, plan)
    return recv_SD, plan.tokens_per_local_expert, DispatchHandle(plan, routing.probs_TK, group, transport)


def combine(y_SD: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
    """Inverse of :func:`dispatch`, weighting each expert output by its routing probability (unless the
    experts did: ``handle.probs_S``): [T, D]."""
    plan = handle.plan
    if isinstance(plan, sf.StaticPlan):
        y_BD = all_to_all_equal(sf.uncompact_fn(y_SD, plan), handle.group)
        return unpermute(sf.unpad_send_fn(y_BD, plan), handle.probs_TK, plan.permute)
    y_ND = unsort_by_local_expert(y_SD, plan)
    if not _sort_is_identity(plan):
        y_ND = all_to_all(y_ND, plan.send_splits, plan.recv_splits, handle.group, handle.transport)
    return unpermute(y_ND, handle.probs_TK, plan.permute)
