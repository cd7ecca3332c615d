"""Layer schedules ``none`` and ``chunked``: the one place where the layer decides what waits for what.

Shape legend: T local tokens, K top-k, D hidden, E global experts, C chunks; per chunk c: N_c rows sent,
S_c rows received.

``none``: route -> dispatch -> experts -> combine, each step waiting for the previous (autograd
through the dispatcher's and the experts' functions).

``chunked``: the T local tokens are cut into C contiguous chunks (``torch.tensor_split``; a chunk may
be empty when C > T, every rank still runs C rounds so the collectives match). The router runs once
on all T tokens (it is per token, so chunking it would change nothing), and the per-expert counts of
all C chunks are exchanged in ONE all-to-all + host sync. Then, in forward:

    iteration c:  start dispatch(c+1) | wait dispatch(c); experts(c)   (combine(c-1) still in flight)
                  start combine(c)    | wait combine(c-1); unpermute(c-1)
and the mirror image in backward:
    iteration c:  start grad-dispatch(c+1) | wait grad-dispatch(c); experts dgrad(c); start grad-combine(c);
                  wait grad-combine(c-1); un-permute(c-1)
    after the last dgrad: ONE grouped weight-gradient GEMM pair over the rows of every chunk (gathered
                  into expert-major order), under the last grad-combine (or deferred into the WgradStore)

On CPU the all-to-alls run on gloo's thread (``async_op=True``); on CUDA on ``comm_stream`` with events.
The chunked path is one autograd Function with an explicit backward (autograd's engine would run
the backward steps one after the other, with no all-to-all in flight).

Why one weight-gradient GEMM: a wgrad per chunk writes the full [L, D, 2F] + [L, F, D] gradient once per
chunk and adds it up (``dw += dw_c``: three passes over the expert weights per extra chunk, 1.9 ms of bf16
adds at the DeepSeek-V3 shape on one H200, docs/benchmarks.md), and runs C smaller GEMMs. Gathering the
chunks' rows costs one pass over the activations instead, and the GEMM keeps its full size.

Numerics: the same function as ``none``; the forward and dgrad GEMMs see fewer rows per call, which can
change rounding (not bitwise). The weight gradient reduces each expert's rows in (chunk, source rank,
token) order: at EP 1 that is ``none``'s order (token order), so there it matches ``none`` bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .all_to_all import all_to_all_async, group_size
from .counts import block_transpose_index, exchange_counts, local_plan, make_dispatch_plan
from .dispatcher import (
    combine,
    dispatch,
    permute_rows,
    permute_rows_backward,
    permute_weights,
    permute_weights_backward,
    plan_permute,
    sort_rows,
    unpermute_rows,
    unpermute_rows_backward,
    unsort_rows,
)
from .experts import GroupedExperts, experts_dgrad, experts_forward, experts_wgrad
from .router import Routing
from .sync_free import check_usable
from .wgrad import WgradStore, accumulate_grad

SCHEDULES = ("none", "chunked")


def run_none(x_TD, routing: Routing, experts: GroupedExperts, *, num_experts: int, group,
             wgrad_store: WgradStore | None = None, counts_group=None, transport=None,
             sync_free: bool = False, capacity: int | None = None) -> torch.Tensor:
    recv_SD, per_expert, handle = dispatch(x_TD, routing, num_experts=num_experts, group=group,
                                           counts_group=counts_group, transport=transport,
                                           sync_free=sync_free, capacity=capacity)
    if sync_free:  # the loop path would read the counts on the host
        check_usable(None, experts.path_for(recv_SD))
    y_SD = experts(recv_SD, per_expert, wgrad_store, probs_S=handle.probs_S)
    return combine(y_SD, handle)


@dataclass(frozen=True)
class ChunkPlan:
    bounds: tuple[tuple[int, int], ...]  # token ranges [a, b) of the chunks
    plans: tuple  # DispatchPlan per chunk


def plan_chunks(experts_TK: torch.Tensor, num_experts: int, chunks: int, group, counts_group=None) -> ChunkPlan:
    num_tokens = experts_TK.shape[0]
    sizes = [num_tokens // chunks + (1 if c < num_tokens % chunks else 0) for c in range(chunks)]
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    pplans = [plan_permute(experts_TK[a:b], num_experts) for a, b in bounds]
    if group_size(group) == 1:  # nothing to exchange (and, on CUDA, no host sync: counts.py)
        return ChunkPlan(tuple(bounds), tuple(local_plan(p) for p in pplans))
    counts_CE = torch.stack([p.tokens_per_expert_E for p in pplans])
    # The one host sync of the layer, for all chunks at once.
    send, recv = exchange_counts(counts_CE, num_experts, group, counts_group=counts_group)
    plans = tuple(make_dispatch_plan(p, s, r) for p, s, r in zip(pplans, send, recv, strict=True))
    return ChunkPlan(tuple(bounds), plans)


@dataclass(frozen=True)
class _ChunkedArgs:
    chunk_plan: ChunkPlan
    group: object
    comm_stream: object
    store: WgradStore | None
    transport: object = None


class _ChunkedMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_TD, probs_TK, w1, w2, args: _ChunkedArgs):
        cp, group, stream, tr = args.chunk_plan, args.group, args.comm_stream, args.transport
        num_chunks = len(cp.bounds)

        # One rank: the weights go to the experts, as in dispatcher.dispatch (bitwise the "none" path).
        local = group_size(group) == 1

        def start_dispatch(c):
            (a, b), plan = cp.bounds[c], cp.plans[c]
            x_ND = permute_rows(x_TD[a:b], plan.permute)
            return all_to_all_async(x_ND, plan.recv_splits, plan.send_splits, group, stream, transport=tr)

        def finish_combine(c):
            y_ND = inflight_combine[c].wait()
            a, b = cp.bounds[c]
            y_NDs[c] = None if local else y_ND
            outs[c] = unpermute_rows(y_ND, None if local else probs_TK[a:b], cp.plans[c].permute)

        saved, y_NDs, outs = [None] * num_chunks, [None] * num_chunks, [None] * num_chunks
        inflight_dispatch, inflight_combine = {0: start_dispatch(0)}, {}
        for c in range(num_chunks):
            plan = cp.plans[c]
            if c + 1 < num_chunks:
                inflight_dispatch[c + 1] = start_dispatch(c + 1)
            x_SD = sort_rows(inflight_dispatch.pop(c).wait(), plan)
            a, b = cp.bounds[c]
            p_S = permute_weights(probs_TK[a:b], plan.permute) if local else None
            y_SD, h = experts_forward(x_SD, w1, w2, plan.tokens_per_local_expert, probs_S=p_S)
            saved[c] = (x_SD, h, p_S)
            inflight_combine[c] = all_to_all_async(unsort_rows(y_SD, plan), plan.send_splits,
                                                   plan.recv_splits, group, stream, transport=tr)
            if c > 0:
                finish_combine(c - 1)
        finish_combine(num_chunks - 1)
        ctx.args, ctx.saved, ctx.y_NDs, ctx.local = args, saved, y_NDs, local
        ctx.save_for_backward(probs_TK)
        # The parameter objects themselves: deferred wgrad accumulates into their .grad.
        ctx.params = (w1, w2)
        return torch.cat(outs) if outs else x_TD.new_zeros(x_TD.shape)

    @staticmethod
    def backward(ctx, g_TD):
        args = ctx.args
        cp, group, stream, store, tr = args.chunk_plan, args.group, args.comm_stream, args.store, args.transport
        (probs_TK,) = ctx.saved_tensors
        w1_param, w2_param = ctx.params
        w1, w2 = w1_param.detach(), w2_param.detach()
        num_chunks = len(cp.bounds)
        g_TD = g_TD.contiguous()
        g_probs, g_x, wgrad_inputs = [None] * num_chunks, [None] * num_chunks, [None] * num_chunks
        dw = [None, None]

        def start_grad_dispatch(c):
            (a, b), plan = cp.bounds[c], cp.plans[c]
            p_TK = None if ctx.local else probs_TK[a:b]
            g_ND, g_probs[c] = unpermute_rows_backward(g_TD[a:b], ctx.y_NDs[c], p_TK, plan.permute)
            return all_to_all_async(g_ND, plan.recv_splits, plan.send_splits, group, stream, transport=tr)

        def finish_grad_combine(c):
            g_x[c] = permute_rows_backward(inflight_combine.pop(c).wait(), cp.plans[c].permute)

        inflight_dispatch, inflight_combine = {0: start_grad_dispatch(0)}, {}
        for c in range(num_chunks):
            plan = cp.plans[c]
            if c + 1 < num_chunks:
                inflight_dispatch[c + 1] = start_grad_dispatch(c + 1)
            dy_SD = sort_rows(inflight_dispatch.pop(c).wait(), plan)
            x_SD, h, p_S = ctx.saved[c]
            ctx.saved[c] = None
            dx_SD, wgrad_inputs[c], g_p_S = experts_dgrad(dy_SD, x_SD, h, w1, w2, plan.tokens_per_local_expert,
                                                          probs_S=p_S)
            if g_p_S is not None:  # EP 1: the weights' gradient, from the experts, back to (token, k) order
                g_probs[c] = permute_weights_backward(g_p_S.to(probs_TK.dtype), plan.permute)
            inflight_combine[c] = all_to_all_async(unsort_rows(dx_SD, plan), plan.send_splits,
                                                   plan.recv_splits, group, stream, transport=tr)
            if c + 1 == num_chunks:
                # One weight-gradient GEMM pair for all chunks, under the last grad-combine.
                inputs, counts = merge_chunk_wgrad_inputs(wgrad_inputs, [p.tokens_per_local_expert for p in cp.plans])
                wgrad_inputs = None
                if store is not None:
                    store.defer(_wgrad_closure(inputs, w1_param, w2_param, w1, w2, counts))
                else:
                    dw = list(experts_wgrad(inputs, w1, w2, counts))
            if c > 0:
                finish_grad_combine(c - 1)
        finish_grad_combine(num_chunks - 1)
        ctx.saved = ctx.y_NDs = None  # free activations early
        return torch.cat(g_x), torch.cat(g_probs), dw[0], dw[1], None


def merge_chunk_wgrad_inputs(inputs: list, counts_CL: list):
    """The chunks' wgrad inputs (each grouped by local expert) as one set in expert-major order.

    Returns (wgrad_inputs, counts) for :func:`experts_wgrad`: rows of expert j from chunk 0, then chunk 1,
    ... One gather per tensor, by an index built on the device when the counts are (EP 1 on CUDA: no host
    sync; the total row count is known on the host from the tensors' shapes).
    """
    if len(inputs) == 1:
        return inputs[0], counts_CL[0]
    cats = [torch.cat([inp[i] for inp in inputs]) for i in range(4)]  # x, a, dh, dy
    device = cats[0].device
    on_device = isinstance(counts_CL[0], torch.Tensor)
    c_CL = torch.stack(list(counts_CL)) if on_device else torch.tensor(counts_CL, dtype=torch.int64)
    idx = block_transpose_index(c_CL, total=cats[0].shape[0])  # (chunk, expert) -> (expert, chunk)
    if not on_device:  # built on the host from host counts: a pinned, non-blocking copy (no host sync)
        idx = idx.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else idx.to(device)
    merged = tuple(t.index_select(0, idx) for t in cats)
    counts = c_CL.sum(0) if on_device else tuple(int(v) for v in c_CL.sum(0).tolist())
    return (*merged, None), counts  # offsets: experts_wgrad builds them from the merged counts


def _wgrad_closure(wgrad_inputs, w1_param, w2_param, w1, w2, counts):
    def closure():
        dw1, dw2 = experts_wgrad(wgrad_inputs, w1, w2, counts)
        accumulate_grad(w1_param, dw1)
        accumulate_grad(w2_param, dw2)

    return closure


def run_chunked(x_TD, routing: Routing, experts: GroupedExperts, *, num_experts: int, group, chunks: int,
                comm_stream=None, wgrad_store: WgradStore | None = None, counts_group=None,
                transport=None) -> torch.Tensor:
    cp = plan_chunks(routing.experts_TK, num_experts, chunks, group, counts_group)
    args = _ChunkedArgs(cp, group, comm_stream, wgrad_store, transport)
    return _ChunkedMoE.apply(x_TD, routing.probs_TK, experts.w1, experts.w2, args)

