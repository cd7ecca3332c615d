"""Token dispatcher over an explicit process group: permute, exchange counts, all-to-all, sort; and back.

Shape legend: T local tokens, K top-k, N = T*K routed rows sent by this rank, S rows received by this
rank (for its local experts), D hidden, E global experts, L = E / R local experts, R ranks in the group.

Global expert e lives on rank e // L as local expert e % L.

Forward (dispatch):
  1. permute:  x_ND[i] = x_TD[perm_N[i] // K], perm_N = stable argsort of experts_TK.flatten(); rows for
               rank r are then contiguous (sorted by global expert), send_splits[r] = their count.
  2. exchange_counts: a tiny all-to-all of the per-expert counts, then ONE device-to-host copy
               (``.tolist()``). This is the only host sync of a dropless layer: the variable splits of
               the next all-to-all must be known on the host by gloo and NCCL alike.
  3. all-to-all: received rows are grouped by (source rank, local expert).
  4. sort_by_local_expert: regroup them by (local expert, source rank), the layout grouped GEMMs want.
Combine is the exact inverse (unsort, reverse all-to-all, unpermute) and applies the routing weights:
  out_TD[t] = sum_k probs_TK[t, k] * y(t, k)        (in fp32, cast back to y's dtype)

Every step is a gather by a permutation, so every backward is a gather by the inverse permutation
plus a fixed-order sum over K: deterministic on CPU and GPU (no scatter-add, no atomics).

``dispatch``/``combine`` are autograd-aware and synchronous. Schedules use the plain steps below
(``plan_permute``, ``permute_rows``, ``exchange_counts``, ``make_dispatch_plan``, ``all_to_all_async``,
``sort_rows``, ``unpermute_rows`` and their ``*_backward``) to start and wait each piece separately.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import fused
from .all_to_all import all_to_all, all_to_all_sync, group_size
from .router import Routing


@dataclass(frozen=True)
class PermutePlan:
    """perm_N: assignment ids (t*K + k) in expert order; inv_perm_N its inverse; token_N = perm_N // K."""

    perm_N: torch.Tensor
    inv_perm_N: torch.Tensor
    token_N: torch.Tensor
    tokens_per_expert_E: torch.Tensor  # int64, on the device
    num_tokens: int
    topk: int


@dataclass(frozen=True)
class DispatchPlan:
    """Everything both directions need; host ints for the splits, device indices for the sorts."""

    permute: PermutePlan
    send_splits: tuple[int, ...]  # rows sent to each rank
    recv_splits: tuple[int, ...]  # rows received from each rank
    recv_counts_RL: tuple[tuple[int, ...], ...]  # rows from source rank s for local expert j
    tokens_per_local_expert: tuple[int, ...]
    sort_idx_S: torch.Tensor  # sorted[j] = received[sort_idx_S[j]]
    unsort_idx_S: torch.Tensor  # received[i] = sorted[unsort_idx_S[i]]


@dataclass(frozen=True)
class DispatchHandle:
    """What ``combine`` needs from ``dispatch``; frozen, nothing else is kept anywhere."""

    plan: DispatchPlan
    probs_TK: torch.Tensor
    group: object


def check_experts_divisible(num_experts: int, world: int) -> int:
    if num_experts % world != 0:
        raise ValueError(f"num_experts={num_experts} is not divisible by the EP size {world}")
    return num_experts // world


# ---------------------------------------------------------------- permute (plain steps)
def plan_permute(experts_TK: torch.Tensor, num_experts: int) -> PermutePlan:
    num_tokens, topk = experts_TK.shape
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
    return x_TD.index_select(0, plan.token_N)


def permute_rows_backward(g_ND: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    if fused.available(g_ND):  # gather + fp32 sum over K in one pass (no [T, K, D] intermediate)
        return fused.weighted_gather_sum(g_ND, plan.inv_perm_N, None, plan.num_tokens, plan.topk)
    g_TKD = g_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, g_ND.shape[1])
    return g_TKD.sum(1)


def unpermute_rows(y_ND: torch.Tensor, probs_TK: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    if fused.available(y_ND):  # same fp32 math, one read of y and one write of out (fused.py)
        return fused.weighted_gather_sum(y_ND, plan.inv_perm_N, probs_TK.float(), plan.num_tokens, plan.topk)
    y_TKD = y_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, y_ND.shape[1])
    # Weighted sum in fp32 so bf16/fp16 results do not depend on K's rounding order.
    return (probs_TK.float().unsqueeze(-1) * y_TKD.float()).sum(1).to(y_ND.dtype)


def unpermute_rows_backward(g_TD, y_ND, probs_TK, plan: PermutePlan):
    """Returns (g_ND, g_probs_TK) for ``unpermute_rows``."""
    if fused.available(y_ND):
        g_ND, g_probs = fused.weighted_gather_sum_backward(g_TD, y_ND, plan.inv_perm_N, probs_TK.float())
        return g_ND, g_probs.to(probs_TK.dtype)
    y_TKD = y_ND.index_select(0, plan.inv_perm_N).view(plan.num_tokens, plan.topk, y_ND.shape[1]).float()
    g32_T1D = g_TD.float().unsqueeze(1)
    g_probs_TK = (g32_T1D * y_TKD).sum(-1).to(probs_TK.dtype)
    g_TKD = (probs_TK.float().unsqueeze(-1) * g32_T1D).to(y_ND.dtype)
    g_ND = g_TKD.reshape(plan.num_tokens * plan.topk, y_ND.shape[1]).index_select(0, plan.perm_N)
    return g_ND, g_probs_TK


# ---------------------------------------------------------------- counts and plan
def exchange_counts(counts_XE: torch.Tensor, num_experts: int, group):
    """All-to-all of per-expert row counts for X dispatches at once (X = 1, or the number of chunks).

    Returns host lists ``(send_XE, recv_XRL)``. This is the layer's one device-to-host sync (both
    lists come back in a single ``.tolist()``); batching the chunks makes it one sync per layer.
    """
    world = group_size(group)
    local = check_experts_divisible(num_experts, world)
    nx = counts_XE.shape[0]
    counts_XE = counts_XE.to(torch.int64)
    send_RXL = counts_XE.view(nx, world, local).permute(1, 0, 2).contiguous()
    recv_RXL = all_to_all_sync(send_RXL.view(world, -1), [1] * world, [1] * world, group)
    both = torch.cat([counts_XE.reshape(-1), recv_RXL.reshape(-1)]).tolist()
    send = [both[i * num_experts:(i + 1) * num_experts] for i in range(nx)]
    recv_flat = both[nx * num_experts:]
    recv = [[recv_flat[(s * nx + x) * local:(s * nx + x + 1) * local] for s in range(world)] for x in range(nx)]
    return send, recv


def make_dispatch_plan(pplan: PermutePlan, send_E: list[int], recv_RL: list[list[int]]) -> DispatchPlan:
    world, local = len(recv_RL), len(recv_RL[0])
    device = pplan.perm_N.device
    if world == 1:  # the sort is the identity (never applied, see _sort_is_identity): no host index work
        ident = torch.arange(sum(recv_RL[0]), device=device)
        return DispatchPlan(permute=pplan, send_splits=(sum(send_E),), recv_splits=(sum(recv_RL[0]),),
                            recv_counts_RL=(tuple(recv_RL[0]),), tokens_per_local_expert=tuple(recv_RL[0]),
                            sort_idx_S=ident, unsort_idx_S=ident)
    send_splits = tuple(sum(send_E[r * local:(r + 1) * local]) for r in range(world))
    recv_splits = tuple(sum(row) for row in recv_RL)
    per_expert = tuple(sum(recv_RL[s][j] for s in range(world)) for j in range(local))
    # Offsets of the (source, local expert) blocks in arrival order; index math on the host (tiny).
    offsets, acc = [[0] * local for _ in range(world)], 0
    for s in range(world):
        for j in range(local):
            offsets[s][j] = acc
            acc += recv_RL[s][j]
    pieces = [torch.arange(offsets[s][j], offsets[s][j] + recv_RL[s][j])
              for j in range(local) for s in range(world)]
    sort_idx = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.int64)
    unsort_idx = torch.empty_like(sort_idx)
    unsort_idx[sort_idx] = torch.arange(sort_idx.numel())
    return DispatchPlan(
        permute=pplan, send_splits=send_splits, recv_splits=recv_splits,
        recv_counts_RL=tuple(tuple(r) for r in recv_RL), tokens_per_local_expert=per_expert,
        sort_idx_S=_to_device(sort_idx, device), unsort_idx_S=_to_device(unsort_idx, device),
    )


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host index -> device without a host sync: ``.to("cuda")`` from pageable memory synchronizes
    the host with the stream; from pinned memory with ``non_blocking`` it does not."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


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
    @staticmethod
    def forward(ctx, x_TD, plan):
        ctx.plan = plan
        return permute_rows(x_TD, plan)

    @staticmethod
    def backward(ctx, g_ND):
        return permute_rows_backward(g_ND, ctx.plan), None


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
        ctx.save_for_backward(y_ND, probs_TK)
        return unpermute_rows(y_ND, probs_TK, plan)

    @staticmethod
    def backward(ctx, g_TD):
        y_ND, probs_TK = ctx.saved_tensors
        g_ND, g_probs = unpermute_rows_backward(g_TD, y_ND, probs_TK, ctx.plan)
        return g_ND, g_probs, None


def unpermute(y_ND: torch.Tensor, probs_TK: torch.Tensor, plan: PermutePlan) -> torch.Tensor:
    """Autograd-aware inverse of :func:`permute` applying the routing weights -> out_TD."""
    return _UnpermuteFn.apply(y_ND, probs_TK, plan)


def permute(x_TD: torch.Tensor, routing: Routing, num_experts: int) -> tuple[torch.Tensor, PermutePlan]:
    """Autograd-aware step 1. Returns (x_ND sorted by global expert, plan)."""
    plan = plan_permute(routing.experts_TK, num_experts)
    return _PermuteFn.apply(x_TD, plan), plan


def sort_by_local_expert(recv_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    """Autograd-aware step 4: (source, local expert) order -> (local expert, source) order."""
    if _sort_is_identity(plan):
        return recv_SD
    return _GatherPermFn.apply(recv_SD, plan.sort_idx_S, plan.unsort_idx_S)


def unsort_by_local_expert(y_SD: torch.Tensor, plan: DispatchPlan) -> torch.Tensor:
    if _sort_is_identity(plan):
        return y_SD
    return _GatherPermFn.apply(y_SD, plan.unsort_idx_S, plan.sort_idx_S)


def dispatch(x_TD: torch.Tensor, routing: Routing, *, num_experts: int, group):
    """Synchronous, autograd-aware dispatch.

    Returns ``(recv_x_SD, tokens_per_local_expert, handle)``: rows grouped by local expert (a tuple
    of host ints, sum S), and the frozen :class:`DispatchHandle` that :func:`combine` consumes.
    """
    x_ND, pplan = permute(x_TD, routing, num_experts)
    (send_E,), (recv_RL,) = exchange_counts(pplan.tokens_per_expert_E.unsqueeze(0), num_experts, group)
    plan = make_dispatch_plan(pplan, send_E, recv_RL)
    # One rank: the all-to-all is the identity (skipped; its autograd wrapper would copy [N, D]).
    if not _sort_is_identity(plan):
        x_ND = all_to_all(x_ND, plan.recv_splits, plan.send_splits, group)
    recv_SD = sort_by_local_expert(x_ND, plan)
    return recv_SD, plan.tokens_per_local_expert, DispatchHandle(plan, routing.probs_TK, group)


def combine(y_SD: torch.Tensor, handle: DispatchHandle) -> torch.Tensor:
    """Inverse of :func:`dispatch`, weighting each expert output by its routing probability: [T, D]."""
    plan = handle.plan
    y_ND = unsort_by_local_expert(y_SD, plan)
    if not _sort_is_identity(plan):
        y_ND = all_to_all(y_ND, plan.send_splits, plan.recv_splits, handle.group)
    return unpermute(y_ND, handle.probs_TK, plan.permute)
