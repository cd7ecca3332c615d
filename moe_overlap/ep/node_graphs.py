"""CUDA graphs of the experts node of the 1F1B / sequential node schedules (nodes.py), captured once per layer.

Why: at small expert shapes the node schedules are host-bound like the layer (graphed.py); the experts node (the
sort into expert order, two grouped GEMMs and the SwiGLU, the sort back, and the same in backward) issues the
most ops of the four. Replayed from a graph it issues one launch each way, and the all-to-alls stay outside, on
their stream, between the graphed nodes.

Where it applies (``graphs_apply``): on CUDA, where the node's shapes and offsets live on the device: EP 1
(counts on the device, counts.local_plan) or the sync-free path at any EP size (sync_free.py). Not with the
default EP > 1 path (host splits) and not with delayed wgrad (the experts' backward hands its weight gradient to
the WgradStore as a closure, which a replayed graph would not hand again): those nodes run eagerly.

Two graphs per layer (``slot`` = micro-batch parity): a graph's saved activations live in its static buffers,
so a second forward replay before the first one's backward would overwrite them; 1F1B holds at most two
micro-batches in flight (F(k+1) beside B(k)), the sequential order one. Every input of the node (the rows, the
routing weights at EP 1, the counts and, on the sync-free path, the plan's device indices) is a graph input,
copied into the graph's static buffer at each call; outputs and input gradients are the graph's static buffers,
valid until the same slot replays again (two micro-batches later, when nothing reads them any more).

``maker`` is ``torch.cuda.make_graphed_callables``; tests on CPU pass a stand-in that returns the module
itself, to check that the node computes the same through this wiring.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn

from . import sync_free as sf
from .experts import _ExpertsFn, expert_path
from .wgrad import accumulate_grad


def graphs_apply(device: torch.device, local: bool, sync_free: bool, delayed_wgrad: bool) -> tuple[bool, str]:
    """(whether the experts node can be graphed, why) for one step's options."""
    if device.type != "cuda":
        return False, "CPU ranks: CUDA graphs need a CUDA device"
    if delayed_wgrad:
        return False, "delayed wgrad: the experts' weight gradient leaves the node as a closure (eager node)"
    if not (local or sync_free):
        return False, "EP > 1 on the default path: the all-to-all's splits come to the host (use sync_free)"
    return True, "experts node graphed (" + ("EP 1" if local and not sync_free else "sync-free EP path") + ")"


class _ExpertsNode(nn.Module):
    """The experts node as a function of tensors only (what ``make_graphed_callables`` takes).

    The expert weights are inputs, not parameters of this module: a graph's parameter gradients come back as its
    static buffers, and autograd would keep the first as ``.grad`` itself (stolen, not copied), which the next
    replay overwrites; as inputs, their gradients land on per-call leaves and nodes.py accumulates a copy. Given
    the parameters' own storage as samples, every replay reads the live weights without copying them.
    """

    def __init__(self, sync_free: bool) -> None:
        super().__init__()
        self.sync_free = sync_free

    def forward(self, recv, w1, w2, *rest):
        if self.sync_free:  # rest: counts, sort_idx, unsort_idx, unsort_mask
            counts, sort_idx, unsort_idx, unsort_mask = rest
            plan = SimpleNamespace(sort_idx_B=sort_idx, unsort_idx_B=unsort_idx, unsort_mask_B=unsort_mask)
            xs = sf.compact_fn(recv, plan)
            sf.check_usable(None, expert_path(xs, w1, w2))
            return sf.uncompact_fn(_ExpertsFn.apply(xs, w1, w2, None, counts, None), plan)
        probs_S, counts = rest  # EP 1: the rows are already in expert order, the weights go to the experts
        return _ExpertsFn.apply(recv, w1, w2, probs_S, counts, None)


class ExpertGraphs:
    """The captured experts nodes of one model, by (layer, slot, input shapes); see the module docstring."""

    def __init__(self, maker=None, warmup_iters: int = 3) -> None:
        self.maker = maker if maker is not None else torch.cuda.make_graphed_callables
        self.warmup_iters = warmup_iters
        self._graphed: dict = {}
        self.captured = 0
        self.error: str | None = None  # a capture that failed: that node runs eagerly from then on (and says so)

    def applies(self, device: torch.device, local: bool, sync_free: bool, delayed_wgrad: bool) -> tuple[bool, str]:
        return graphs_apply(device, local, sync_free, delayed_wgrad)

    def run(self, experts: nn.Module, slot: int, sync_free: bool, inputs: tuple[torch.Tensor, ...]):
        """``inputs`` from :func:`node_inputs`; returns the node's output (the graph's static buffer)."""
        key = (id(experts), slot, sync_free) + tuple((t.shape, t.dtype, t.requires_grad) for t in inputs)
        fn = self._graphed.get(key)
        if fn is None:
            node = _ExpertsNode(sync_free)
            if inputs[0].is_cuda:  # the capture must not see work of other streams still running
                torch.cuda.synchronize(inputs[0].device)
            samples = tuple(t if i in (1, 2) else t.detach().clone().requires_grad_(t.requires_grad)
                            for i, t in enumerate(inputs))  # 1, 2: the weights' own storage (no copy per replay)
            try:
                fn = self.maker(node, samples, num_warmup_iters=self.warmup_iters) if self.maker is \
                    torch.cuda.make_graphed_callables else self.maker(node, samples)
                self.captured += 1
            except (RuntimeError, AssertionError) as e:  # the same node, eagerly: same results, no graph
                self.error, fn = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", node
            self._graphed[key] = fn
        return fn(*inputs)


def weight_leaves(experts: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-call leaves on the expert weights' storage; their .grad goes to the parameters by :func:`accumulate`."""
    return experts.w1.detach().requires_grad_(), experts.w2.detach().requires_grad_()


def accumulate(experts: nn.Module, leaves: tuple[torch.Tensor, torch.Tensor]) -> None:
    """The leaves' gradients into the parameters' .grad, copied where .grad is unset (never a graph's buffer)."""
    for param, leaf in zip((experts.w1, experts.w2), leaves, strict=True):
        accumulate_grad(param, leaf.grad.clone() if param.grad is None else leaf.grad)


def node_inputs(recv_in: torch.Tensor, plan, probs_S_in: torch.Tensor | None, sync_free: bool, weights) -> tuple:
    """The experts node's tensors, in _ExpertsNode's order."""
    if sync_free:
        return (recv_in, *weights, plan.tokens_per_local_expert, plan.sort_idx_B, plan.unsort_idx_B,
                plan.unsort_mask_B)
    return recv_in, *weights, probs_S_in, plan.tokens_per_local_expert
