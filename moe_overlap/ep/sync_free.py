"""The host-sync-free EP > 1 path: counts exchanged on the device, static-size all-to-alls, index math on device.

Shape legend: T local tokens, K top-k, N = T*K routed rows of this rank, E global experts, R ranks, L = E / R
local experts, P rows per peer block (the worst case N, or a capacity), B = R*P rows of a padded buffer
(R blocks of P rows), G = L*R (local expert, source rank) groups, D hidden.

Why: the default path (counts.py) brings the token counts to the host, because ``all_to_all_single``'s variable
splits are host ints. That is one host sync per layer and micro-batch, and what keeps an EP > 1 layer out of a
CUDA graph. Here every size is known from the shapes alone, as DeepEP's ``num_worst_tokens`` does for its
receive buffer (deepseek-ai/DeepEP ``deep_ep/buffer.py``) and Megatron-Core's
``moe_pad_expert_input_to_capacity`` for its full-iteration CUDA graphs:

  1. counts:   this rank's [R, L] counts travel by an equal-block all-to-all of the count tensor on the data
               group (on the device with NCCL; no ``.tolist()``).
  2. dispatch: the rows for peer r go into block r of a [B, D] buffer (rows beyond the peer's count are zero);
               an equal-block ``all_to_all_single`` (static sizes: NCCL can run it inside a CUDA graph) moves
               the blocks; block s of the result holds source s's rows, by local expert.
  3. compact:  a gather by an index computed on the device regroups the received rows by (local expert,
               source) into the first S rows of a [B, D] buffer, the layout the grouped GEMMs want; they run
               over device offsets (experts.py), so rows beyond S (unspecified values) are never read by
               them, and no valid row is ever computed from one.
  The combine runs the same steps backwards, and each step's backward is the gather of the step that mirrors
  it (every valid row maps to exactly one valid row: no scatter, no atomics, deterministic).

Bitwise: the grouped GEMMs see the same rows in the same order as on the default path, and every other step is
a copy, so losses and gradients equal the default path's bit for bit (tests/distributed/test_sync_free.py).

Capacity (``capacity`` rows per peer, P < N): a rank sends at most P rows to each peer, the first P of that
peer's rows in dispatch order (by global expert, then token); the rest are dropped: they contribute zero to
their token's output and receive no gradient (the router's aux loss still counts them). With the default
``capacity=None`` P = N = T*K (the most one rank can send one peer): dropless, and equal to the default path.

Requirements: every rank of the group runs the layer on the same number of tokens T (the blocks must be equal
on every rank, as for a CUDA graph anyway) and the experts take the grouped-GEMM path (the per-expert loop
reads the counts on the host); the copy-engine transport (host splits) is not used here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .all_to_all import all_to_all_equal_async, group_size
from .counts import PermutePlan, check_experts_divisible


@dataclass(frozen=True)
class StaticPlan:
    """Device indices of both directions; only shapes (N, P, R) are host ints."""

    permute: PermutePlan
    rows_per_peer: int  # P
    world: int  # R
    send_idx_B: torch.Tensor  # block row b = (r, p) <- x_ND[send_idx_B[b]] where send_mask_B[b]
    send_mask_B: torch.Tensor
    back_idx_N: torch.Tensor  # x_ND[n] <- block row back_idx_N[n] where back_mask_N[n] (None: every row kept)
    back_mask_N: torch.Tensor | None
    sort_idx_B: torch.Tensor  # compact row i <- received block row sort_idx_B[i] (i < S; rows beyond: unspecified)
    unsort_idx_B: torch.Tensor  # received block row b <- compact row unsort_idx_B[b] where unsort_mask_B[b]
    unsort_mask_B: torch.Tensor
    tokens_per_local_expert: torch.Tensor  # int64 [L], on the device

    # the all-to-all's (equal) splits, in the default plan's terms: schedules pass them as is
    @property
    def send_splits(self) -> tuple[int, ...]:
        return (self.rows_per_peer,) * self.world

    recv_splits = send_splits


def rows_per_peer(num_rows: int, capacity: int | None) -> int:
    """P: the worst case N (dropless), or the capacity when it is smaller."""
    if capacity is None:
        return num_rows
    if not isinstance(capacity, int) or capacity < 1:
        raise ValueError(f"capacity={capacity!r}: rows per peer must be an int >= 1 (or None: the worst case, "
                         "tokens * topk, no token dropped)")
    return min(num_rows, capacity)


def kept_counts(pplan: PermutePlan, world: int, capacity: int | None = None) -> torch.Tensor:
    """[R, L] rows this rank sends each peer per local expert: all of them, or the first P of each peer's."""
    counts_RL = pplan.tokens_per_expert_E.view(world, -1)  # int64 (plan_permute)
    p = rows_per_peer(pplan.perm_N.numel(), capacity)
    if p >= pplan.perm_N.numel():
        return counts_RL
    excl_RL = torch.cumsum(counts_RL, 1) - counts_RL
    return torch.minimum(counts_RL, (p - excl_RL).clamp(min=0))


def start_counts(pplan: PermutePlan, num_experts: int, group, capacity: int | None = None,
                 stream=None, after=None):
    """Step 1 started: ``(kept_RL, handle)``; ``handle.wait()`` gives recv_RL [source, local expert] (device)."""
    world = group_size(group)
    check_experts_divisible(num_experts, world)
    kept_RL = kept_counts(pplan, world, capacity)
    return kept_RL, all_to_all_equal_async(kept_RL, group, stream, after)


@dataclass(frozen=True)
class SendSide:
    """The send half of a plan: known from this rank's own counts, before the exchange completes."""

    rows_per_peer: int
    send_idx_B: torch.Tensor
    send_mask_B: torch.Tensor
    back_idx_N: torch.Tensor
    back_mask_N: torch.Tensor | None


def send_side(pplan: PermutePlan, kept_RL: torch.Tensor, capacity: int | None = None) -> SendSide:
    """Where this rank's rows go in its send blocks and come back from (device ops of static shape)."""
    world, local = kept_RL.shape
    n = pplan.perm_N.numel()
    p = rows_per_peer(n, capacity)
    # this rank's rows for peer r start at off_R[r] in x_ND (rows sorted by global expert)
    seg_R = pplan.tokens_per_expert_E.view(world, local).sum(1)
    ends_R = torch.cumsum(seg_R, 0)
    off_R = ends_R - seg_R
    p_1P = torch.arange(p, device=kept_RL.device).unsqueeze(0)
    send_idx = (off_R.unsqueeze(1) + p_1P).clamp_(0, max(n - 1, 0)).view(-1)
    send_mask = (p_1P < kept_RL.sum(1, keepdim=True)).view(-1, 1)
    n_N = torch.arange(n, device=kept_RL.device)
    r_N = torch.searchsorted(ends_R, n_N, right=True)  # < R: every row belongs to a peer
    q_N = n_N - off_R.index_select(0, r_N)
    if p < n:  # capacity: rows past it were not sent (zero on their way back)
        return SendSide(p, send_idx, send_mask, r_N * p + q_N.clamp(max=p - 1), (q_N < p).view(-1, 1))
    return SendSide(p, send_idx, send_mask, r_N * p + q_N, None)


def build_plan(pplan: PermutePlan, send: SendSide, recv_RL: torch.Tensor) -> StaticPlan:
    """The receive half from the exchanged counts, by device ops of static shape (no host read).

    Block s of the received buffer holds source s's rows by local expert j (at rexcl_RL[s, j] in it); the
    compact order is group g = (j, s), starting at start_G[g]. Each group's rows keep their order, so a compact
    row i of group g comes from s * P + rexcl_RL[s, j] + (i - start_G[g]), and the way back is the same offset
    negated: a per-group base plus the row's position, never a per-row host loop.
    """
    world, local = recv_RL.shape
    p = send.rows_per_peer
    b = world * p
    device = recv_RL.device
    rincl_RL = torch.cumsum(recv_RL, 1)
    rexcl_RL = rincl_RL - recv_RL
    ends_G = torch.cumsum(recv_RL.t().reshape(-1), 0)
    start_LR = (ends_G - recv_RL.t().reshape(-1)).view(local, world)
    s_R = torch.arange(world, device=device)
    src_base_G = (s_R * p + rexcl_RL.t() - start_LR).reshape(-1)  # source row = base + compact row
    i_B = torch.arange(b, device=device)
    g_B = torch.searchsorted(ends_G, i_B, right=True).clamp_(max=local * world - 1)
    sort_idx = (src_base_G.index_select(0, g_B) + i_B).clamp_(0, max(b - 1, 0))
    p_RP = torch.arange(p, device=device).repeat(world, 1)
    j_RP = torch.searchsorted(rincl_RL, p_RP, right=True).clamp_(max=local - 1)
    dst_base_RL = start_LR.t() - rexcl_RL  # compact row = base + position in the block
    unsort_idx = (dst_base_RL.gather(1, j_RP) + p_RP).clamp_(0, max(b - 1, 0)).view(-1)
    unsort_mask = (p_RP < rincl_RL[:, -1:]).view(-1, 1)
    return StaticPlan(pplan, p, world, send.send_idx_B, send.send_mask_B, send.back_idx_N, send.back_mask_N,
                      sort_idx, unsort_idx, unsort_mask, recv_RL.sum(0))


def gather(x: torch.Tensor, idx: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """rows x[idx], zero where ``mask`` is False (None: every row kept)."""
    out = x.index_select(0, idx)
    return out if mask is None else torch.where(mask, out, 0.0)  # masks are kept as [rows, 1]


# The four plain steps (each one's backward is the step that mirrors it) and their autograd forms.
def pad_send(x_ND, plan: StaticPlan | SendSide):
    return gather(x_ND, plan.send_idx_B, plan.send_mask_B)


def unpad_send(x_BD, plan: StaticPlan | SendSide):
    return gather(x_BD, plan.back_idx_N, plan.back_mask_N)


def compact(recv_BD, plan: StaticPlan):
    return gather(recv_BD, plan.sort_idx_B, None)  # rows beyond S: read by nothing valid (module docstring)


def uncompact(y_BD, plan: StaticPlan):
    return gather(y_BD, plan.unsort_idx_B, plan.unsort_mask_B)


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, plan, fwd, bwd):
        ctx.plan, ctx.bwd = plan, bwd
        return fwd(x, plan)

    @staticmethod
    def backward(ctx, g):
        return ctx.bwd(g.contiguous(), ctx.plan), None, None, None


def pad_send_fn(x_ND, plan):
    return _Step.apply(x_ND, plan, pad_send, unpad_send)


def unpad_send_fn(x_BD, plan):
    return _Step.apply(x_BD, plan, unpad_send, pad_send)


def compact_fn(recv_BD, plan):
    return _Step.apply(recv_BD, plan, compact, uncompact)


def uncompact_fn(y_BD, plan):
    return _Step.apply(y_BD, plan, uncompact, compact)


def check_usable(transport, experts_path: str | None = None) -> None:
    """ValueError where the sync-free path cannot run without a host sync."""
    if transport is not None:
        raise ValueError("sync_free: the copy-engine transport takes host splits; use NCCL (transport=None) "
                         "with the sync-free path, or the default path with copy engines")
    if experts_path is not None and experts_path != "grouped_mm":
        raise ValueError("sync_free: the experts take the per-expert loop here (torch._grouped_mm unsupported or "
                         "rows not 16-byte aligned), which reads the counts on the host; use a hidden and ffn "
                         "size whose rows are 16-byte multiples, or the default path")


def buffer_bytes(tokens: int, topk: int, hidden: int, ffn: int, world: int, *, dtype_bytes: int = 2,
                 capacity: int | None = None) -> dict[str, int]:
    """Memory of one layer's padded buffers per rank and micro-batch (docs/ep-implementation.md's table).

    ``rows``: B = R * P; ``wire_BD``: one [B, D] buffer (the send blocks, the received blocks, the compact
    rows, the expert output and its blocks are each one); ``kept_forward``: what the experts keep for the
    backward (compact input [B, D] and h [B, 2F]); ``dropless_kept``: the same on the default path when routing
    is balanced (S = T * K rows), for comparison.
    """
    p = rows_per_peer(tokens * topk, capacity)
    rows = world * p
    return {"rows": rows, "wire_BD": rows * hidden * dtype_bytes,
            "kept_forward": rows * (hidden + 2 * ffn) * dtype_bytes,
            "dropless_kept": tokens * topk * (hidden + 2 * ffn) * dtype_bytes}
