"""MoELayer: router + token dispatcher + grouped SwiGLU experts, expert-parallel over a process group.

Shape legend: T local tokens, D hidden (``hidden``), F expert ffn size (``ffn``), E global experts,
L = E / R local experts on each of the R ranks of the EP group, K top-k.

Public contract (the state dict is enough to recompute the layer; docs/ep-implementation.md):

  parameters   router.weight [E, D]        replicated on every rank
               experts.w1    [L, D, 2F]    local experts; columns [:F] gate, [F:] up
               experts.w2    [L, F, D]
               global expert e lives on rank e // L as local expert e % L
  forward      x [..., D] -> (out [..., D], aux_loss)
    z = x.reshape(T, D)
    probs_TK, experts_TK = route(z, router.weight, topk=K, score=..., normalize=...)  (router.py)
    out[t] = sum_k probs_TK[t, k] * W2[e] . (silu(z[t] W1[e][:, :F]) * (z[t] W1[e][:, F:])),  e = experts_TK[t, k]
    aux_loss = the Switch load-balancing loss of the local tokens (unscaled; the caller scales and adds it)
    With ``z_loss_coeff > 0`` the router z-loss's gradient (times that coeff) is attached to ``out``.

``seed=None`` skips the seeded init (default random init on ``device``; for production-size benchmarks);
``skip_init=True`` leaves the expert weights uninitialised (a caller that writes every parameter itself).

``forward(x, *, group=None, schedule="none"|"chunked", chunks=C, comm_stream=None, wgrad_store=None,
counts_group=None, transport=None)``:
``group`` defaults to the group given at construction (None: the default group when torch.distributed
is initialised, else a single process). ``schedule`` picks how communication and compute are ordered
(schedule.py); all schedules compute the same function. With ``wgrad_store`` the experts' weight
gradients are deferred into it (``store.run_all()`` accumulates them into ``.grad`` later).
``counts_group``: a host (gloo) group over the same ranks for the token-count exchange (ep/counts.py);
``transport``: copy-engine all-to-alls (ep/transport.py) instead of the group's own.
``sync_free=True`` (schedule ``none``): the host-sync-free path of ep/sync_free.py (counts and splits stay on the
device, static-size all-to-alls; what ep/graphed.py captures at EP > 1), with ``capacity`` rows per peer (None:
the worst case tokens * topk, dropless and bitwise the default path).
Router and dense gradients are local to this rank's tokens: all-reduce them over the data-parallel
ranks as usual. Expert gradients already include every rank's tokens.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from .counts import check_experts_divisible
from .experts import GroupedExperts, check_dtype, expert_path
from .router import SCORE_FUNCTIONS, check_topk, route
from .router import attach_aux_losses as _attach
from .schedule import SCHEDULES, run_chunked, run_none
from .wgrad import WgradStore


def group_rank_size(group) -> tuple[int, int]:
    if group is None and not dist.is_initialized():
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def init_full_weights(hidden: int, ffn: int, num_experts: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """The full (unsharded) fp32 weights a layer with this seed starts from: N(0, 1/fan_in)."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "router.weight": torch.randn(num_experts, hidden, generator=gen) / math.sqrt(hidden),
        "experts.w1": torch.randn(num_experts, hidden, 2 * ffn, generator=gen) / math.sqrt(hidden),
        "experts.w2": torch.randn(num_experts, ffn, hidden, generator=gen) / math.sqrt(ffn),
    }


def shard_full_weights(full: dict[str, torch.Tensor], ep_rank: int, ep_size: int) -> dict[str, torch.Tensor]:
    """This rank's state dict from the full weights (router replicated, experts sliced by rank)."""
    local = check_experts_divisible(full["router.weight"].shape[0], ep_size)
    sl = slice(ep_rank * local, (ep_rank + 1) * local)
    return {"router.weight": full["router.weight"], "experts.w1": full["experts.w1"][sl],
            "experts.w2": full["experts.w2"][sl]}


class MoELayer(nn.Module):
    """Expert-parallel MoE layer; see the module docstring for the exact contract."""

    def __init__(self, hidden: int, ffn: int, num_experts: int, topk: int, group=None, *,
                 score: str = "softmax", normalize: bool | None = None, force_balance: bool = False,
                 z_loss_coeff: float = 0.0, dtype=torch.float32, device=None, seed: int | None = 0,
                 skip_init: bool = False):
        super().__init__()
        for name, value in (("hidden", hidden), ("ffn", ffn), ("num_experts", num_experts)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be a positive int")
        check_topk(topk, num_experts)
        check_dtype(dtype)
        if score not in SCORE_FUNCTIONS:
            raise ValueError(f"score={score!r}: must be one of {SCORE_FUNCTIONS}")
        ep_rank, ep_size = group_rank_size(group)
        self.num_local_experts = check_experts_divisible(num_experts, ep_size)
        self.hidden, self.ffn, self.num_experts, self.topk = hidden, ffn, num_experts, topk
        self.score, self.normalize, self.force_balance = score, normalize, force_balance
        self.z_loss_coeff = z_loss_coeff
        self.group = group  # the caller's group (explicit, never a global); forward may override it
        self.ep_rank, self.ep_size = ep_rank, ep_size
        self.router = nn.Linear(hidden, num_experts, bias=False, dtype=dtype, device=device)
        self.experts = GroupedExperts(self.num_local_experts, hidden, ffn, dtype=dtype, device=device,
                                      skip_init=skip_init)
        if seed is None or skip_init:
            # seed=None (production-size benchmarks): the full fp32 [E, D, 2F] draw on the host would cost tens
            # of GB and minutes per rank; the parameters keep their default random init, made on `device`.
            return
        shard = shard_full_weights(init_full_weights(hidden, ffn, num_experts, seed), ep_rank, ep_size)
        with torch.no_grad():
            for name, p in self.named_parameters():
                p.copy_(shard[name])

    def expert_path(self, x_SD: torch.Tensor) -> str:
        """'grouped_mm' or 'loop': the GEMM path the experts take for rows like ``x_SD``."""
        return expert_path(x_SD, self.experts.w1, self.experts.w2)

    def _check(self, x, group, schedule, chunks) -> None:
        if x.shape[-1] != self.hidden:
            raise ValueError(f"x: hidden size {x.shape[-1]} != layer hidden={self.hidden}")
        check_dtype(x.dtype, "x dtype")
        w = self.experts.w1
        if x.dtype != w.dtype:
            raise ValueError(f"x dtype={x.dtype} != layer dtype={w.dtype}; cast the input or the layer")
        if x.device != w.device:
            raise ValueError(f"x device={x.device} != layer device={w.device}")
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule={schedule!r}: must be one of {SCHEDULES} (1f1b lives in schedule_1f1b.py)")
        if not isinstance(chunks, int) or chunks < 1:
            raise ValueError(f"chunks={chunks!r}: must be an int >= 1")
        _, size = group_rank_size(group)
        if size != self.ep_size:
            raise ValueError(f"group size={size} != EP size {self.ep_size} this layer was built for")

    def forward(self, x: torch.Tensor, *, group=None, schedule: str = "none", chunks: int = 1,
                comm_stream=None, wgrad_store: WgradStore | None = None, counts_group=None, transport=None,
                sync_free: bool = False, capacity: int | None = None):
        """x [..., D] -> (out [..., D] same dtype, aux_loss fp32 scalar). See the module docstring."""
        group = self.group if group is None else group
        self._check(x, group, schedule, chunks)
        if sync_free and schedule != "none":
            raise ValueError(f"sync_free=True runs with schedule='none' (got {schedule!r}); the chunked schedule "
                             "keeps the host splits (the 1f1b nodes take sync_free through step.forward_backward)")
        x_TD = x.reshape(-1, self.hidden)
        routing = route(x_TD, self.router.weight, topk=self.topk, score=self.score, z_loss=self.z_loss_coeff != 0,
                        normalize=self.normalize, force_balance=self.force_balance)
        if schedule == "none":
            out_TD = run_none(x_TD, routing, self.experts, num_experts=self.num_experts, group=group,
                              wgrad_store=wgrad_store, counts_group=counts_group, transport=transport,
                              sync_free=sync_free, capacity=capacity)
        else:
            out_TD = run_chunked(x_TD, routing, self.experts, num_experts=self.num_experts, group=group,
                                 chunks=chunks, comm_stream=comm_stream, wgrad_store=wgrad_store,
                                 counts_group=counts_group, transport=transport)
        out_TD = _attach(out_TD, routing, 0.0, self.z_loss_coeff)
        return out_TD.view(x.shape), routing.aux_loss
