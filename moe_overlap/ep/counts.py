"""Token counts: exchange them between EP ranks, and build the dispatch plan from them.

Shape legend: X dispatches exchanged at once (1, or the chunks of a layer), E global experts, R ranks in
the group, L = E / R local experts.

The all-to-all's variable splits must be host ints (gloo and NCCL both take them on the host), so every
dropless layer at EP > 1 has one device-to-host sync: the counts. Where that sync sits decides whether it
costs anything:

* ``start_count_exchange`` only *starts* it: on CUDA the counts go to pinned host memory with an async
  copy (a copy engine, no SMs) on a side stream that waits for the router's event only, so the compute
  stream keeps running; ``CountsHandle.wait()`` blocks the host later, when the schedule has queued the
  compute that should run meanwhile (schedule_1f1b.layer_pair queues the backward experts first).
* With a host (gloo) ``counts_group`` the exchange itself runs on the host, off the data communicator:
  an NCCL all-to-all of the counts on the data group would queue behind the data all-to-all in flight
  on that communicator (one NCCL stream per group) and need SMs that a running GEMM holds.
  Without one (``counts_group=None``) the counts travel over the data group, on the device, as before.
* ``sync_free.py`` is the alternative without any host sync at EP > 1: the counts stay on the device and the
  all-to-alls move equal, worst-case (or capacity-bounded) peer blocks, so no split is needed on the host.
* EP 1 exchanges nothing. On CUDA its plan keeps the counts on the device (``tokens_per_local_expert``
  is an int64 tensor; the grouped GEMMs take device offsets), so an EP 1 layer has no host sync at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from . import fused, fused_index
from .all_to_all import all_to_all_sync, group_size


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
    """Everything both directions need; host ints for the splits, device indices for the sorts.

    ``tokens_per_local_expert`` is a tuple of host ints, except at EP 1 on CUDA where it is the int64
    device tensor of counts (no host sync; see the module docstring).
    """

    permute: PermutePlan
    send_splits: tuple[int, ...]  # rows sent to each rank
    recv_splits: tuple[int, ...]  # rows received from each rank
    recv_counts_RL: tuple[tuple[int, ...], ...] | None  # rows from source rank s for local expert j (EP > 1)
    tokens_per_local_expert: tuple[int, ...] | torch.Tensor
    sort_idx_S: torch.Tensor | None  # sorted[j] = received[sort_idx_S[j]] (None at EP 1: identity)
    unsort_idx_S: torch.Tensor | None  # received[i] = sorted[unsort_idx_S[i]]


def check_experts_divisible(num_experts: int, world: int) -> int:
    if num_experts % world != 0:
        raise ValueError(f"num_experts={num_experts} is not divisible by the EP size {world}")
    return num_experts // world


@dataclass(frozen=True)
class CountsHandle:
    """A count exchange in flight. ``wait()`` returns host lists ``(send_XE, recv_XRL)``."""

    local_XE: torch.Tensor  # this rank's counts: host memory (pinned on CUDA, filled by an async copy)
    ready: torch.cuda.Event | None  # recorded after that copy (None: already on the host)
    num_experts: int
    group: object  # the data group (its size is the EP size)
    counts_group: object | None  # where the counts travel: a host group, or None for the data group

    def wait(self) -> tuple[list[list[int]], list[list[list[int]]]]:
        if self.ready is not None:
            self.ready.synchronize()  # the one host sync: only the router's work and a small copy
        world = group_size(self.group)
        local = self.num_experts // world
        nx = self.local_XE.shape[0]
        send_RXL = self.local_XE.view(nx, world, local).permute(1, 0, 2).contiguous()
        recv_RXL = all_to_all_sync(send_RXL.view(world, -1), [1] * world, [1] * world,
                                   self.group if self.counts_group is None else self.counts_group)
        both = torch.cat([self.local_XE.reshape(-1), recv_RXL.reshape(-1).to(self.local_XE.device)]).tolist()
        return _split_lists(both, nx, world, local, self.num_experts)


def _split_lists(both: list[int], nx: int, world: int, local: int, num_experts: int):
    send = [both[i * num_experts:(i + 1) * num_experts] for i in range(nx)]
    recv_flat = both[nx * num_experts:]
    recv = [[recv_flat[(s * nx + x) * local:(s * nx + x + 1) * local] for s in range(world)] for x in range(nx)]
    return send, recv


def is_host_group(group) -> bool:
    return group is not None and dist.get_backend(group) == "gloo"


def start_count_exchange(counts_XE: torch.Tensor, num_experts: int, group, *, counts_group=None,
                         stream: torch.cuda.Stream | None = None) -> CountsHandle:
    """Start exchanging the per-expert counts of X dispatches (see the module docstring).

    counts_XE: int64 [X, E] on the device. ``stream``: a CUDA side stream for the device-to-host copy
    (None: the current stream). Raises ValueError when E is not divisible by the group size.
    """
    world = group_size(group)
    check_experts_divisible(num_experts, world)
    if counts_group is not None and not is_host_group(counts_group):
        raise ValueError(f"counts_group has backend {dist.get_backend(counts_group)!r}: it must be a host "
                         "(gloo) group over the EP ranks, e.g. dist.new_group(ranks, backend='gloo'); "
                         "or pass counts_group=None to exchange counts over the data group")
    counts_XE = counts_XE.to(torch.int64)
    host_exchange = counts_group is not None or not counts_XE.is_cuda
    if not counts_XE.is_cuda:
        return CountsHandle(counts_XE, None, num_experts, group, counts_group)
    if not host_exchange:  # counts over the data group, on the device: no early copy to start
        return CountsHandle(counts_XE, None, num_experts, group, None)
    producer = torch.cuda.current_stream(counts_XE.device)
    side = stream if stream is not None else producer
    side.wait_stream(producer)
    with torch.cuda.stream(side):
        host = torch.empty(counts_XE.shape, dtype=torch.int64, pin_memory=True)
        host.copy_(counts_XE, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(side)
    counts_XE.record_stream(side)
    return CountsHandle(host, ready, num_experts, group, counts_group)


def exchange_counts(counts_XE: torch.Tensor, num_experts: int, group, *, counts_group=None):
    """Blocking count exchange: host lists ``(send_XE, recv_XRL)`` (one device-to-host sync)."""
    return start_count_exchange(counts_XE, num_experts, group, counts_group=counts_group).wait()


def local_plan(pplan: PermutePlan) -> DispatchPlan:
    """EP 1: nothing is exchanged; every row stays, in expert order. No host sync on CUDA."""
    rows = pplan.perm_N.numel()
    counts = pplan.tokens_per_expert_E
    per_expert = counts if counts.is_cuda else tuple(counts.tolist())
    return DispatchPlan(permute=pplan, send_splits=(rows,), recv_splits=(rows,), recv_counts_RL=None,
                        tokens_per_local_expert=per_expert, sort_idx_S=None, unsort_idx_S=None)


def make_dispatch_plan(pplan: PermutePlan, send_E: list[int], recv_RL: list[list[int]]) -> DispatchPlan:
    world, local = len(recv_RL), len(recv_RL[0])
    if world == 1:
        return local_plan(pplan)
    device = pplan.perm_N.device
    send_splits = tuple(sum(send_E[r * local:(r + 1) * local]) for r in range(world))
    recv_splits = tuple(sum(row) for row in recv_RL)
    per_expert = tuple(sum(recv_RL[s][j] for s in range(world)) for j in range(local))
    # The sort indices come from the [R, L] counts by a few vectorised ops (one arange per block cost ~1 ms of
    # host time at 128 blocks); on CUDA they run on the device from the counts copied up (pinned, no sync),
    # instead of building and copying two S-long indices on the host.
    if fused.available(pplan.perm_N):  # both indices from one launch (fused_index.py)
        sort_idx, unsort_idx = fused_index.block_transpose_indices(recv_RL, device)
    else:
        counts_SL = _to_device(torch.tensor(recv_RL, dtype=torch.int64), device)
        total = sum(recv_splits)
        sort_idx = block_transpose_index(counts_SL, total)  # (source, expert) arrival order -> (expert, source)
        unsort_idx = block_transpose_index(counts_SL.t(), total)  # and back
    return DispatchPlan(
        permute=pplan, send_splits=send_splits, recv_splits=recv_splits,
        recv_counts_RL=tuple(tuple(r) for r in recv_RL), tokens_per_local_expert=per_expert,
        sort_idx_S=sort_idx, unsort_idx_S=unsort_idx,
    )


def block_transpose_index(counts_AB: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """Gather index that regroups rows laid out in blocks (a, b) in a-major order into b-major order.

    counts_AB[a, b] rows form block (a, b); the input holds blocks (0,0), (0,1), ..., (1,0), ...; the
    output ``idx`` (int64, on the counts' device) puts block (0,0), (1,0), ..., (0,1), ... with
    ``out = rows.index_select(0, idx)``. Built with a cumsum and one repeat_interleave, no per-block op.
    ``total`` (the row count) is required for device counts: reading it from them would sync the host.
    """
    c_flat = counts_AB.reshape(-1)
    src_AB = (torch.cumsum(c_flat, 0) - c_flat).view_as(counts_AB)
    c_BA, src_BA = counts_AB.t().reshape(-1), src_AB.t().reshape(-1)
    dst_BA = torch.cumsum(c_BA, 0) - c_BA
    if total is None:
        if counts_AB.is_cuda:
            raise ValueError("block_transpose_index: pass total= for device counts (no host sync)")
        total = int(c_flat.sum())
    return torch.repeat_interleave(src_BA - dst_BA, c_BA, output_size=total) + \
        torch.arange(total, device=counts_AB.device)


def plan_for(pplan: PermutePlan, num_experts: int, group, *, counts_group=None) -> DispatchPlan:
    """Exchange one dispatch's counts (EP > 1) and build its plan; EP 1 needs no exchange."""
    if group_size(group) == 1:
        return local_plan(pplan)
    (send_E,), (recv_RL,) = exchange_counts(pplan.tokens_per_expert_E.unsqueeze(0), num_experts, group,
                                            counts_group=counts_group)
    return make_dispatch_plan(pplan, send_E, recv_RL)


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host index -> device without a host sync: ``.to("cuda")`` from pageable memory synchronizes
    the host with the stream; from pinned memory with ``non_blocking`` it does not."""
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
