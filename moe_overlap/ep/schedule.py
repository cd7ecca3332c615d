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
                  experts wgrad(c) (or defer it into the WgradStore) | wait grad-combine(c-1); un-permute(c-1)

On CPU the all-to-alls run on gloo's thread (``async_op=True``); on CUDA on ``comm_stream`` with events.
The chunked path is one autograd Function with an explicit backward (autograd's engine would run
the backward steps one after the other, with no all-to-all in flight).

Numerics: the same function as ``none``; the expert GEMMs see fewer rows per call, which can change
fp32 rounding (not bitwise), and the weight gradient is the sum of the per-chunk gradients in chunk order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .all_to_all import all_to_all_async
from .dispatcher import (
    combine,
    dispatch,
    exchange_counts,
    make_dispatch_plan,
    permute_rows,
    permute_rows_backward,
    plan_permute,
    sort_rows,
    unpermute_rows,
    unpermute_rows_backward,
    unsort_rows,
)
from .experts import GroupedExperts, experts_dgrad, experts_forward, experts_wgrad
from .router import Routing
from .wgrad import WgradStore, accumulate_grad

SCHEDULES = ("none", "chunked")


def run_none(x_TD, routing: Routing, experts: GroupedExperts, *, num_experts: int, group,
             wgrad_store: WgradStore | None = None) -> torch.Tensor:
    recv_SD, per_expert, handle = dispatch(x_TD, routing, num_experts=num_experts, group=group)
    y_SD = experts(recv_SD, per_expert, wgrad_store)
    return combine(y_SD, handle)


@dataclass(frozen=True)
class ChunkPlan:
    bounds: tuple[tuple[int, int], ...]  # token ranges [a, b) of the chunks
    plans: tuple  # DispatchPlan per chunk


def plan_chunks(experts_TK: torch.Tensor, num_experts: int, chunks: int, group) -> ChunkPlan:
    num_tokens = experts_TK.shape[0]
    sizes = [num_tokens // chunks + (1 if c < num_tokens % chunks else 0) for c in range(chunks)]
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    pplans = [plan_permute(experts_TK[a:b], num_experts) for a, b in bounds]
    counts_CE = torch.stack([p.tokens_per_expert_E for p in pplans])
    send, recv = exchange_counts(counts_CE, num_experts, group)  # the one host sync of the layer
    plans = tuple(make_dispatch_plan(p, s, r) for p, s, r in zip(pplans, send, recv, strict=True))
    return ChunkPlan(tuple(bounds), plans)


@dataclass(frozen=True)
class _ChunkedArgs:
    chunk_plan: ChunkPlan
    group: object
    comm_stream: object
    store: WgradStore | None


class _ChunkedMoE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_TD, probs_TK, w1, w2, args: _ChunkedArgs):
        cp, group, stream = args.chunk_plan, args.group, args.comm_stream
        num_chunks = len(cp.bounds)

        def start_dispatch(c):
            (a, b), plan = cp.bounds[c], cp.plans[c]
            x_ND = permute_rows(x_TD[a:b], plan.permute)
            return all_to_all_async(x_ND, plan.recv_splits, plan.send_splits, group, stream)

        def finish_combine(c):
            y_ND = inflight_combine[c].wait()
            a, b = cp.bounds[c]
            y_NDs[c] = y_ND
            outs[c] = unpermute_rows(y_ND, probs_TK[a:b], cp.plans[c].permute)

        saved, y_NDs, outs = [None] * num_chunks, [None] * num_chunks, [None] * num_chunks
        inflight_dispatch, inflight_combine = {0: start_dispatch(0)}, {}
        for c in range(num_chunks):
            plan = cp.plans[c]
            if c + 1 < num_chunks:
                inflight_dispatch[c + 1] = start_dispatch(c + 1)
            x_SD = sort_rows(inflight_dispatch.pop(c).wait(), plan)
            y_SD, h = experts_forward(x_SD, w1, w2, plan.tokens_per_local_expert)
            saved[c] = (x_SD, h)
            inflight_combine[c] = all_to_all_async(unsort_rows(y_SD, plan), plan.send_splits,
                                                   plan.recv_splits, group, stream)
            if c > 0:
                finish_combine(c - 1)
        finish_combine(num_chunks - 1)
        ctx.args, ctx.saved, ctx.y_NDs = args, saved, y_NDs
        ctx.save_for_backward(probs_TK)
        # The parameter objects themselves: deferred wgrad accumulates into their .grad.
        ctx.params = (w1, w2)
        return torch.cat(outs) if outs else x_TD.new_zeros(x_TD.shape)

    @staticmethod
    def backward(ctx, g_TD):
        args = ctx.args
        cp, group, stream, store = args.chunk_plan, args.group, args.comm_stream, args.store
        (probs_TK,) = ctx.saved_tensors
        w1_param, w2_param = ctx.params
        w1, w2 = w1_param.detach(), w2_param.detach()
        num_chunks = len(cp.bounds)
        g_TD = g_TD.contiguous()
        g_probs, g_x = [None] * num_chunks, [None] * num_chunks
        dw = [None, None]

        def start_grad_dispatch(c):
            (a, b), plan = cp.bounds[c], cp.plans[c]
            g_ND, g_probs[c] = unpermute_rows_backward(g_TD[a:b], ctx.y_NDs[c], probs_TK[a:b], plan.permute)
            return all_to_all_async(g_ND, plan.recv_splits, plan.send_splits, group, stream)

        def finish_grad_combine(c):
            g_x[c] = permute_rows_backward(inflight_combine.pop(c).wait(), cp.plans[c].permute)

        inflight_dispatch, inflight_combine = {0: start_grad_dispatch(0)}, {}
        for c in range(num_chunks):
            plan = cp.plans[c]
            counts = plan.tokens_per_local_expert
            if c + 1 < num_chunks:
                inflight_dispatch[c + 1] = start_grad_dispatch(c + 1)
            dy_SD = sort_rows(inflight_dispatch.pop(c).wait(), plan)
            x_SD, h = ctx.saved[c]
            dx_SD, wgrad_inputs = experts_dgrad(dy_SD, x_SD, h, w1, w2, counts)
            inflight_combine[c] = all_to_all_async(unsort_rows(dx_SD, plan), plan.send_splits,
                                                   plan.recv_splits, group, stream)
            # Weight gradients run here, while grad-combine(c) and grad-dispatch(c+1) are in flight.
            if store is not None:
                store.defer(_wgrad_closure(wgrad_inputs, w1_param, w2_param, w1, w2, counts))
            else:
                dw1, dw2 = experts_wgrad(wgrad_inputs, w1, w2, counts)
                dw = [dw1, dw2] if dw[0] is None else [dw[0].add_(dw1), dw[1].add_(dw2)]
            if c > 0:
                finish_grad_combine(c - 1)
        finish_grad_combine(num_chunks - 1)
        ctx.saved = ctx.y_NDs = None  # free activations early
        return torch.cat(g_x), torch.cat(g_probs), dw[0], dw[1], None


def _wgrad_closure(wgrad_inputs, w1_param, w2_param, w1, w2, counts):
    def closure():
        dw1, dw2 = experts_wgrad(wgrad_inputs, w1, w2, counts)
        accumulate_grad(w1_param, dw1)
        accumulate_grad(w2_param, dw2)

    return closure


def run_chunked(x_TD, routing: Routing, experts: GroupedExperts, *, num_experts: int, group, chunks: int,
                comm_stream=None, wgrad_store: WgradStore | None = None) -> torch.Tensor:
    cp = plan_chunks(routing.experts_TK, num_experts, chunks, group)
    args = _ChunkedArgs(cp, group, comm_stream, wgrad_store)
    return _ChunkedMoE.apply(x_TD, routing.probs_TK, experts.w1, experts.w2, args)

