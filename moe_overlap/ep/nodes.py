"""The four nodes of one MoE transformer layer, plus the embedding and loss nodes, for one micro-batch.

Shape legend: B micro-batch size, S sequence, T = B*S local tokens, K top-k, N = T*K rows this rank
sends, R rows it receives for its local experts, D hidden.

Nodes (Megatron-Core's fine-grained layer split: Megatron-LM `megatron/core/models/gpt/fine_grained_callables.py`):
    pre-dispatch (compute): h = x + attn(norm1(x)); z = norm2(h); route(z); permute z -> x_ND; counts
    dispatch     (comm):    x_ND -- all-to-all --> recv_RD
    experts      (compute): sort by local expert, grouped SwiGLU experts, unsort -> y_RD
    combine      (comm):    y_RD -- all-to-all --> y_ND; out = h + unpermute(y_ND, probs)
At EP 1 (a one-rank group) the routing weights go to the experts node instead, permuted like the rows, and
the combine only sums (dispatcher.py's module docstring says why): the same ops as ``dispatch``/``combine``.

Each compute island detaches its inputs into fresh leaves, runs under autograd, and keeps its outputs;
its backward is `torch.autograd.backward(outputs, grads)` and hands the leaves' `.grad` to the node
before it. The comm nodes never build a graph: forward and backward are explicit async all-to-alls
(start / wait), so a schedule can put compute of another micro-batch between the two.

State lives on the per-micro-batch run objects (`LayerRun`, `MicroBatchRun`), never on the modules;
each node drops what it no longer needs after its backward so activations are freed as in autograd.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from moe_overlap.ep import node_graphs
from moe_overlap.ep import sync_free as sf
from moe_overlap.ep.all_to_all import A2AHandle, all_to_all_async, all_to_all_equal_async, group_size
from moe_overlap.ep.counts import (
    CountsHandle,
    DispatchPlan,
    local_plan,
    make_dispatch_plan,
    start_count_exchange,
)
from moe_overlap.ep.dispatcher import permute, sort_by_local_expert, unpermute, unsort_by_local_expert
from moe_overlap.ep.router import attach_aux_losses, route
from moe_overlap.ep.streams import current_stream, record_event
from moe_overlap.ep.wgrad import WgradStore


@dataclass(frozen=True)
class NodeContext:
    """Explicit distributed state shared by the nodes of one step.

    group: EP process group; comm_stream: CUDA stream for all-to-alls (None on CPU, where gloo's
    async_op supplies the concurrency); store: WgradStore when expert wgrad is delayed;
    grad_scale: d(objective)/d(micro-batch loss), 1/M for M micro-batches; counts_group: a host (gloo)
    group over the same ranks for the token-count exchange (counts.py), None to use ``group``;
    transport: copy-engine all-to-alls (transport.py), None for the group's own; sm_margin: SMs the
    expert GEMMs leave to the all-to-all kernels while one is in flight (sm_margin.py; 0 = off);
    sync_free: the host-sync-free path (sync_free.py: counts and splits on the device, equal-block all-to-alls
    of ``capacity`` rows per peer, None: the worst case), at any group size; graphs: node_graphs.ExpertGraphs
    where the step found they apply (node_graphs.graphs_apply), else None.
    """

    group: dist.ProcessGroup
    comm_stream: torch.cuda.Stream | None
    store: WgradStore | None
    grad_scale: float
    counts_group: dist.ProcessGroup | None = None
    transport: object = None  # transport.py copy engines for the all-to-alls (None: the group's own)
    sm_margin: int = 0
    sync_free: bool = False
    capacity: int | None = None
    graphs: object = None  # node_graphs.ExpertGraphs: the experts node replayed from CUDA graphs (None: eager)


def _leaf(t: torch.Tensor) -> torch.Tensor:
    """A node input: cut from the previous node's graph, a fresh leaf that collects its gradient."""
    return t.detach().requires_grad_(t.is_floating_point())


def _backward(outputs: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    torch.autograd.backward(outputs, grads)


class LayerRun:
    """One layer x one micro-batch: the four nodes' forward and backward, as start/wait pieces."""

    def __init__(self, block, ctx: NodeContext, aux_loss_coeff: float, slot: int = 0) -> None:
        self.block, self.ctx, self.aux_coeff = block, ctx, aux_loss_coeff
        self.slot = slot  # which of the layer's two experts-node graphs (micro-batch parity; node_graphs.py)
        self.handle: A2AHandle | None = None
        self.sync_free = ctx.sync_free

    def _a2a(self, x: torch.Tensor, out_splits, in_splits, after=None) -> A2AHandle:
        """Start an all-to-all: the plan's variable splits, or (sync-free) equal blocks."""
        c = self.ctx
        if self.sync_free:
            return all_to_all_equal_async(x, c.group, c.comm_stream, after=after)
        return all_to_all_async(x, out_splits, in_splits, c.group, c.comm_stream, after=after, transport=c.transport)

    def _from_wire(self, x: torch.Tensor) -> torch.Tensor:
        """Rows back in this rank's dispatch order (sync-free: out of the peer blocks)."""
        return sf.unpad_send(x, self.plan) if self.sync_free else x

    def _to_wire(self, x: torch.Tensor) -> torch.Tensor:
        return sf.pad_send(x, self.plan) if self.sync_free else x

    # ------------------------------------------------------------------ forward
    def pre_forward(self, x_BSD: torch.Tensor) -> None:
        """pre-dispatch node: attention + norm + router + permute, then the counts exchange."""
        blk, moe = self.block, self.block.moe
        self.local = group_size(self.ctx.group) == 1 and not self.sync_free
        self.x_in = _leaf(x_BSD)
        with torch.enable_grad():
            self.h_BSD = blk.attention(self.x_in, self.ctx.store)
            z_TD = blk.norm2(self.h_BSD).flatten(0, 1)
            routing = route(z_TD, moe.router.weight, topk=moe.topk, score=moe.score, normalize=moe.normalize,
                            z_loss=moe.z_loss_coeff != 0,
                            force_balance=moe.force_balance)
            if self.local:  # the weights in the rows' order, for the experts (EP 1: dispatcher.py)
                x_ND, self.probs, pplan = permute(z_TD, routing, moe.num_experts, with_probs=True)
            else:
                x_ND, pplan = permute(z_TD, routing, moe.num_experts)
                self.probs = routing.probs_TK  # [T, K], for the combine
            # The router losses' gradients enter here, scaled like the micro-batch loss they belong to.
            scale = self.ctx.grad_scale
            self.x_ND = attach_aux_losses(x_ND, routing, self.aux_coeff * scale, moe.z_loss_coeff * scale)
        # Splits must be host ints for the all-to-all: start moving the counts now (no host wait here);
        # plan_wait() blocks for them once the schedule has queued other compute (counts.py).
        self.pplan = pplan
        self.counts: CountsHandle | None = None
        if self.sync_free:  # counts on the device; the send blocks filled now, before the dispatch's event
            kept_RL, self.counts = sf.start_counts(pplan, moe.num_experts, self.ctx.group, self.ctx.capacity,
                                                   self.ctx.comm_stream)
            self.send = sf.send_side(pplan, kept_RL, self.ctx.capacity)
            self.x_wire = sf.pad_send(self.x_ND.detach(), self.send)
        elif not self.local:
            self.counts = start_count_exchange(pplan.tokens_per_expert_E.unsqueeze(0), moe.num_experts,
                                               self.ctx.group, counts_group=self.ctx.counts_group)
        # The dispatch waits for this event only, so it may be issued after unrelated compute.
        self.x_ready = record_event(current_stream(x_BSD.device))

    def plan_wait(self) -> None:
        """Wait for the counts (EP > 1: the layer's one host sync) and build the dispatch plan."""
        if self.sync_free:  # no host wait: the compute stream waits for the counts' all-to-all
            self.plan = sf.build_plan(self.pplan, self.send, self.counts.wait())
            del self.send
        elif self.counts is None:
            self.plan: DispatchPlan = local_plan(self.pplan)
        else:
            (send_E,), (recv_RL,) = self.counts.wait()
            self.plan = make_dispatch_plan(self.pplan, send_E, recv_RL)
        del self.pplan, self.counts

    def dispatch_forward_start(self) -> None:
        p = self.plan
        x = self.x_wire if self.sync_free else self.x_ND.detach()
        self.handle = self._a2a(x, p.recv_splits, p.send_splits, after=self.x_ready)
        self.x_ready = self.x_wire = None

    def dispatch_forward_wait(self) -> None:
        self.recv_RD = self.handle.wait()
        self.handle = None

    def experts_forward(self) -> None:
        """experts node: (source, expert) -> (expert, source) order, grouped SwiGLU, and back."""
        self.recv_in = _leaf(self.recv_RD)
        self.probs_S_in = _leaf(self.probs) if self.local else None
        del self.recv_RD
        self.w_in = None
        if self.ctx.graphs is not None:  # one replay for the whole node (node_graphs.py)
            experts = self.block.moe.experts
            self.w_in = node_graphs.weight_leaves(experts)
            with torch.enable_grad():
                self.y_RD = self.ctx.graphs.run(experts, self.slot, self.sync_free, node_graphs.node_inputs(
                    self.recv_in, self.plan, self.probs_S_in, self.sync_free, self.w_in))
            return
        with torch.enable_grad():
            if self.sync_free:
                xs_RD = sf.compact_fn(self.recv_in, self.plan)
                sf.check_usable(None, self.block.moe.experts.path_for(xs_RD))
            else:
                xs_RD = sort_by_local_expert(self.recv_in, self.plan)
            ys_RD = self.block.moe.experts(xs_RD, self.plan.tokens_per_local_expert,
                                           wgrad_store=self.ctx.store, probs_S=self.probs_S_in)
            self.y_RD = sf.uncompact_fn(ys_RD, self.plan) if self.sync_free else \
                unsort_by_local_expert(ys_RD, self.plan)

    def combine_forward_start(self) -> None:
        p = self.plan
        self.handle = self._a2a(self.y_RD.detach(), p.send_splits, p.recv_splits)

    def combine_forward_wait(self) -> torch.Tensor:
        """combine node, second half: unpermute with the routing weights, add the residual."""
        self.y_ND_in = _leaf(self._from_wire(self.handle.wait()))
        self.handle = None
        self.probs_in = None if self.local else _leaf(self.probs)
        self.h_in = _leaf(self.h_BSD)
        with torch.enable_grad():
            y_TD = unpermute(self.y_ND_in, self.probs_in, self.plan.permute)
            self.out_BSD = self.h_in + y_TD.view_as(self.h_in)
        return self.out_BSD.detach()

    # ------------------------------------------------------------------ backward
    def combine_backward_start(self, g_BSD: torch.Tensor) -> None:
        _backward([self.out_BSD], [g_BSD])
        p = self.plan
        self.handle = self._a2a(self._to_wire(self.y_ND_in.grad), p.recv_splits, p.send_splits)
        self.g_h_BSD = self.h_in.grad
        if not self.local:
            self.g_probs = self.probs_in.grad
        del self.out_BSD, self.y_ND_in, self.probs_in, self.h_in

    def combine_backward_wait(self) -> None:
        self.g_y_RD = self.handle.wait()
        self.handle = None

    def experts_backward(self) -> None:
        """experts dgrad; with a WgradStore the weight gradients are deferred into it."""
        _backward([self.y_RD], [self.g_y_RD])
        if self.w_in is not None:  # graphed: the weights' gradients came to per-call leaves
            node_graphs.accumulate(self.block.moe.experts, self.w_in)
            self.w_in = None
        if self.local:
            self.g_probs = self.probs_S_in.grad
        del self.y_RD, self.g_y_RD, self.probs_S_in

    def dispatch_backward_start(self) -> None:
        p = self.plan
        self.handle = self._a2a(self.recv_in.grad, p.send_splits, p.recv_splits)
        del self.recv_in

    def dispatch_backward_wait(self) -> None:
        self.g_x_ND = self._from_wire(self.handle.wait())
        self.handle = None

    def pre_backward(self) -> torch.Tensor:
        """pre-dispatch backward: dgrad through router/norm/attention (attention wgrad deferred with a store)."""
        _backward([self.h_BSD, self.x_ND, self.probs], [self.g_h_BSD, self.g_x_ND, self.g_probs])
        g_x = self.x_in.grad
        del self.h_BSD, self.x_ND, self.probs, self.g_h_BSD, self.g_x_ND, self.g_probs, self.x_in
        del self.plan
        return g_x


class MicroBatchRun:
    """One micro-batch through the model: embedding node, L LayerRuns, loss node."""

    def __init__(self, model, tokens_BS: torch.Tensor, labels_BS: torch.Tensor, ctx: NodeContext,
                 slot: int = 0) -> None:
        self.model, self.ctx = model, ctx
        self.tokens_BS, self.labels_BS = tokens_BS, labels_BS
        cfg = model.cfg
        self.layers = [LayerRun(blk, ctx, cfg.aux_loss_coeff, slot) for blk in model.layers]
        self.loss: torch.Tensor | None = None  # detached value, read on the host only at the very end

    def embed_forward(self) -> torch.Tensor:
        with torch.enable_grad():
            self.emb_BSD = self.model.embed(self.tokens_BS)
        return self.emb_BSD.detach()

    def head_forward(self, x_BSD: torch.Tensor) -> None:
        self.head_in = _leaf(x_BSD)
        with torch.enable_grad():
            self.loss_t = self.model.logits_loss(self.head_in, self.labels_BS)
        self.loss = self.loss_t.detach()

    def head_backward(self) -> torch.Tensor:
        _backward([self.loss_t], [torch.full_like(self.loss_t, self.ctx.grad_scale)])
        g = self.head_in.grad
        del self.loss_t, self.head_in
        return g

    def embed_backward(self, g_BSD: torch.Tensor) -> None:
        _backward([self.emb_BSD], [g_BSD])
        del self.emb_BSD
