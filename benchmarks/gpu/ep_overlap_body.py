"""What each rank of benchmarks/gpu/ep_overlap.py runs: one MoE layer per preset, every schedule, and the
pieces alone (all-to-alls, expert GEMMs), timed in the same processes so the efficiency is from one run.

Shape legend: T tokens per rank, D hidden, F expert ffn, E global experts, K top-k, S = T*K rows this
rank receives (balanced routing), L = E / R local experts on each of the R ranks.

What is timed (each measurement starts after a device-wide barrier of all ranks; CUDA events on the
compute stream, or the host clock on CPU; round 0.. warmup-1 are discarded):

  none        MoELayer(schedule="none"): forward; then backward (autograd), no comm stream
  chunked:C   MoELayer(schedule="chunked", chunks=C, comm_stream): forward; backward
  nodes       the same layer through the 1F1B node functions (ep/nodes.py), one micro-batch forward
              then one backward, every all-to-all waited at once: the sequential reference of 1f1b
  1f1b        schedule_1f1b.layer_pair: forward of micro-batch k+1 interleaved with the backward of
              micro-batch k (both T tokens) on one layer, all-to-alls on the comm stream. Not
              separable into forward and backward: only the pair (= fwd + bwd) is reported
  1f1b+wgrad  the same with a WgradStore (expert wgrad deferred under the backward dispatch)
  alone       dispatch a2a, combine a2a and their backward twins (same bytes, swapped splits) on the
              compute stream; expert forward, dgrad and wgrad GEMMs on the received rows

The layer's "attention" is the identity (block.attention returns x): what is timed is the MoE layer,
as in Megatron-Core's single-layer moe_perf figures.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.common.timing import Clock

NVLS_ENV = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")


class MoEOnlyBlock(nn.Module):
    """A layer shaped like ep/model.Block for the node machinery, without attention or norms."""

    def __init__(self, moe: nn.Module) -> None:
        super().__init__()
        self.moe = moe
        self.norm2 = nn.Identity()

    def attention(self, x_BSD: torch.Tensor, wgrad_store=None) -> torch.Tensor:
        return x_BSD


def build_layer(shape: dict, group, rank: int, device, dtype):
    """The benchmarked layer at ``shape`` (balanced routing, default random init on the device), the block
    that runs it through the node machinery, and this rank's inputs: (layer, block, x0, x1, gout)."""
    from moe_overlap.ep.layer import MoELayer

    # seed=None: no host-side draw of all E experts (45 GB fp32 at the DeepSeek-V3 shape).
    layer = MoELayer(shape["hidden"], shape["ffn"], shape["experts"], shape["topk"], group,
                     force_balance=True, dtype=dtype, device=device, seed=None)
    gen = torch.Generator().manual_seed(rank)
    x0, x1, gout = (torch.randn(shape["tokens"], shape["hidden"], generator=gen).to(device, dtype)
                    for _ in range(3))
    return layer, MoEOnlyBlock(layer), x0, x1, gout


def bench_transport(a2a: str, shape: dict, group, device, dtype):
    """(transport or None, why) sized for ``shape``'s largest all-to-all (T * K rows of D elements)."""
    from moe_overlap.ep.transport import make_transport

    return make_transport(a2a, group, device, max_rows=shape["tokens"] * shape["topk"],
                          max_row_bytes=shape["hidden"] * (torch.finfo(dtype).bits // 8))


def _layer_rows(layer, block, x0, x1, gout, clock, comm, chunk_list, margins=()):
    """One round of every schedule; fills the clock. ``comm``: group, stream, counts_group, transport."""
    from moe_overlap.ep.nodes import LayerRun, NodeContext
    from moe_overlap.ep.schedule_1f1b import layer_backward, layer_forward, layer_pair
    from moe_overlap.ep.wgrad import WgradStore

    group, stream = clock.group, comm.stream
    extra = {"counts_group": comm.counts_group, "transport": comm.transport}
    for schedule, chunks in [("none", 1)] + [("chunked", c) for c in chunk_list]:
        key = "none" if schedule == "none" else f"chunked:{chunks}"
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        s = stream if schedule == "chunked" else None
        out, _ = clock(f"{key}/fwd", lambda x=x, sc=schedule, c=chunks, s=s: layer(x, schedule=sc, chunks=c,
                                                                                     comm_stream=s, **extra))
        clock(f"{key}/bwd", lambda out=out: out.backward(gout))
        del out, x
    if comm.transport is not None:  # the overlap-off run a user makes may take NCCL: its `none` too (ratios.py)
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out, _ = clock("none-nccl/fwd", lambda x=x: layer(x, schedule="none", **dict(extra, transport=None)))
        clock("none-nccl/bwd", lambda out=out: out.backward(gout))
        del out, x
    x_BSD, x1_BSD, g_BSD = x0.unsqueeze(0), x1.unsqueeze(0), gout.unsqueeze(0)
    layer.zero_grad(set_to_none=True)
    ctx = NodeContext(group=group, comm_stream=None, store=None, grad_scale=1.0, **extra)
    run = LayerRun(block, ctx, 0.0)
    clock("nodes/fwd", lambda: layer_forward(run, x_BSD))
    clock("nodes/bwd", lambda: layer_backward(run, g_BSD, None))
    pairs = [("1f1b", False, extra), ("1f1b+wgrad", True, extra)]
    for m in margins:  # sm_margin.py: the expert GEMMs leave m SMs to the all-to-all kernels
        pairs += [(f"1f1b sm-{m}", False, dict(extra, sm_margin=m)), (f"1f1b+wgrad sm-{m}", True, dict(extra, sm_margin=m))]
    if comm.counts_group is not None:  # ablation: the token counts over the data communicator, on the device
        pairs.append(("1f1b counts-on-data-group", False, dict(extra, counts_group=None)))
    for key, delay, kw in pairs:
        layer.zero_grad(set_to_none=True)
        store = WgradStore() if delay else None
        ctx = NodeContext(group=group, comm_stream=stream, store=store, grad_scale=1.0, **kw)
        b, f = LayerRun(block, ctx, 0.0), LayerRun(block, ctx, 0.0)
        layer_forward(b, x_BSD)  # micro-batch k's forward, untimed
        clock(f"{key}/pair", lambda f=f, b=b, store=store: layer_pair(f, b, x1_BSD, g_BSD, store))
        layer_backward(f, g_BSD, store)  # finish micro-batch k+1, untimed (frees its activations)
        if store is not None:
            store.run_all()
    layer.zero_grad(set_to_none=True)


def _pieces(layer, x0, clock, comm):
    """The all-to-alls alone and the expert GEMMs alone, for one forward and one backward."""
    from moe_overlap.ep.all_to_all import all_to_all_sync
    from moe_overlap.ep.counts import exchange_counts, make_dispatch_plan
    from moe_overlap.ep.dispatcher import (
        permute_rows,
        plan_permute,
        sort_rows,
        unsort_rows,
    )
    from moe_overlap.ep.experts import experts_dgrad, experts_forward, experts_wgrad, host_counts
    from moe_overlap.ep.router import route

    group = clock.group
    w1, w2 = layer.experts.w1.detach(), layer.experts.w2.detach()
    with torch.no_grad():
        routing = route(x0, layer.router.weight, topk=layer.topk, force_balance=True)
        pplan = plan_permute(routing.experts_TK, layer.num_experts)
        x_ND = permute_rows(x0, pplan)
        send, recv = clock("alone/count exchange", lambda: exchange_counts(
            pplan.tokens_per_expert_E.unsqueeze(0), layer.num_experts, group, counts_group=comm.counts_group))
        plan = make_dispatch_plan(pplan, send[0], recv[0])
        counts = plan.tokens_per_local_expert  # a device tensor at EP 1 on CUDA (no host sync)
        tr = comm.transport
        recv_x = clock("alone/a2a dispatch", lambda: all_to_all_sync(x_ND, plan.recv_splits, plan.send_splits, group,
                                                                     tr))
        xs = sort_rows(recv_x, plan)
        y, h = clock("alone/experts fwd", lambda: experts_forward(xs, w1, w2, counts))
        yr = unsort_rows(y, plan)
        clock("alone/a2a combine", lambda: all_to_all_sync(yr, plan.send_splits, plan.recv_splits, group, tr))
        # Backward: the gradient of the combine travels like a dispatch, that of the dispatch like a combine.
        g_ND = torch.randn_like(x_ND)
        g_recv = clock("alone/a2a grad-combine", lambda: all_to_all_sync(g_ND, plan.recv_splits, plan.send_splits,
                                                                           group, tr))
        dy = sort_rows(g_recv, plan)
        dx, wgi, _ = clock("alone/experts dgrad", lambda: experts_dgrad(dy, xs, h, w1, w2, counts))
        clock("alone/experts wgrad", lambda: experts_wgrad(wgi, w1, w2, counts))
        dxr = unsort_rows(dx, plan)
        clock("alone/a2a grad-dispatch", lambda: all_to_all_sync(dxr, plan.send_splits, plan.recv_splits, group,
                                                                 tr))
    counts = host_counts(counts)
    return {"rows_received": int(sum(counts)), "bytes_per_dispatch": int(x_ND.numel() * x_ND.element_size()),
            "tokens_per_local_expert_min": min(counts), "tokens_per_local_expert_max": max(counts)}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _agreement(layer, block, x0, x1, gout, comm, chunks: int, margins=()) -> dict[str, float]:
    """Untimed: the overlapped paths compute what the sequential ones do (a stream race that made them
    fast and wrong would show here). Relative L2 differences; 0.0 means bitwise equal."""
    from moe_overlap.ep.nodes import LayerRun, NodeContext
    from moe_overlap.ep.schedule_1f1b import layer_backward, layer_forward, layer_pair

    group, stream = comm.group, comm.stream
    extra = {"counts_group": comm.counts_group, "transport": comm.transport}
    with torch.no_grad():
        out_none, _ = layer(x0, schedule="none", **extra)
        out_chunked, _ = layer(x0, schedule="chunked", chunks=chunks, comm_stream=stream, **extra)
    x_BSD, x1_BSD, g_BSD = x0.unsqueeze(0), x1.unsqueeze(0), gout.unsqueeze(0)
    seq = NodeContext(group=group, comm_stream=None, store=None, grad_scale=1.0, **extra)
    run = LayerRun(block, seq, 0.0)
    y1_ref = layer_forward(run, x1_BSD)
    layer_backward(run, g_BSD, None)
    run = LayerRun(block, seq, 0.0)
    layer_forward(run, x_BSD)
    g0_ref = layer_backward(run, g_BSD, None)
    out = {f"chunked:{chunks} vs none, out": _rel(out_chunked, out_none)}
    for m in (0, *margins[-1:]):  # the largest SM margin too: its GEMMs must give the same bits
        ovl = NodeContext(group=group, comm_stream=stream, store=None, grad_scale=1.0, sm_margin=m, **extra)
        b, f = LayerRun(block, ovl, 0.0), LayerRun(block, ovl, 0.0)
        layer_forward(b, x_BSD)
        y1, g0 = layer_pair(f, b, x1_BSD, g_BSD, None)
        layer_backward(f, g_BSD, None)
        tag = f" sm-{m}" if m else ""
        out[f"1f1b{tag} vs nodes, out (micro-batch k+1)"] = _rel(y1, y1_ref)
        out[f"1f1b{tag} vs nodes, dx (micro-batch k)"] = _rel(g0, g0_ref)
    layer.zero_grad(set_to_none=True)
    return out


def balanced_ffn(shape: dict, group, device, dtype, comm) -> int:
    """The expert ffn size that makes the experts' fwd+bwd take about half as long as the layer's four
    all-to-alls on this fabric: communication-bound, where overlap can hide all the compute. Measured here
    at ``shape["ffn"]``, then once more at the first answer (at a small ffn the experts' time is mostly
    launch and host time, so one step from there overshot: 14208 in one run, 30080 in another). Compute grows
    about linearly with ffn, the all-to-alls not at all. Every rank gets the same answer (max over ranks)."""
    ffn = shape["ffn"]
    for _ in range(2):
        ratio = _comm_over_compute(dict(shape, ffn=ffn), group, device, dtype, comm)
        # Multiples of 128 keep the grouped GEMMs' strides aligned; 64k caps the weights at a few GB.
        ffn = int(min(65536, max(128, round(ffn * ratio * BALANCED_COMPUTE_SHARE / 128) * 128)))
    return ffn


BALANCED_COMPUTE_SHARE = 0.5  # the experts' fwd+bwd time as a share of the four all-to-alls'


def _comm_over_compute(shape: dict, group, device, dtype, comm) -> float:
    layer, _, x0, _, _ = build_layer(shape, group, dist.get_rank(group), device, dtype)
    clock = Clock(group, device, warmup=1)
    for r in range(3):
        clock.round = r
        _pieces(layer, x0, clock, comm)
    t = clock.summary()
    comm_ms = sum(t[k]["median_ms"] for k in t if k.startswith("alone/a2a"))
    comp_ms = sum(t[k]["median_ms"] for k in ("alone/experts fwd", "alone/experts dgrad", "alone/experts wgrad"))
    ratio = torch.tensor([comm_ms / max(comp_ms, 1e-6)], dtype=torch.float64, device=device)
    dist.all_reduce(ratio, op=dist.ReduceOp.MAX, group=group)
    del layer, x0
    return float(ratio)


def bench_body(rank, world, group, presets, device_type, dtype_name, rounds, warmup, chunk_list, a2a="nccl",
               margins=()):
    """Runs in every rank: all presets, `warmup + rounds` rounds each. Returns (rank 0's) summaries.

    ``a2a``: the all-to-all transport (moe_overlap/ep/transport.py: nccl | ce | auto); the token counts
    travel over a host (gloo) group when world > 1. A preset with ``"ffn": "balanced"`` gets the ffn size
    that balances compute and communication on this fabric (:func:`balanced_ffn`).
    """
    from types import SimpleNamespace

    from moe_overlap.ep.fabric import FABRICS
    from moe_overlap.ep.streams import make_comm_stream

    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    env = {k: os.environ.get(k) for k in NVLS_ENV}
    if device_type == "cuda" and any(v is None for v in env.values()):
        raise RuntimeError(f"NVLink multicast must be off in every rank; environment has {env}")
    # Recorded, not required: CUDA's default (8) lets the comm stream's kernels run beside the GEMMs.
    env["CUDA_DEVICE_MAX_CONNECTIONS"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
    env.update({k: os.environ.get(k) for k in sorted({k for f in FABRICS.values() for k in f})})
    dtype = getattr(torch, dtype_name)
    counts_group = dist.new_group(backend="gloo") if world > 1 else None
    results = []
    for name, shape in presets:
        shape = dict(shape)
        transport, why = bench_transport(a2a, shape, group, device, dtype)
        comm = SimpleNamespace(group=group, stream=make_comm_stream(device), counts_group=counts_group,
                               transport=transport)
        if shape["ffn"] == "balanced":
            shape["ffn"] = balanced_ffn(dict(shape, ffn=shape["ffn_base"]), group, device, dtype, comm)
        layer, block, x0, x1, gout = build_layer(shape, group, rank, device, dtype)
        clock = Clock(group, device, warmup)
        info = {}
        for r in range(warmup + rounds):
            clock.round = r
            _layer_rows(layer, block, x0, x1, gout, clock, comm, chunk_list, margins)
            info = _pieces(layer, x0, clock, comm)
        info["agreement_rel_l2"] = _agreement(layer, block, x0, x1, gout, comm, max(chunk_list, default=2),
                                              tuple(margins))
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            info["peak_memory_bytes"] = int(torch.cuda.max_memory_allocated(device))
            torch.cuda.reset_peak_memory_stats(device)
        results.append({"preset": name, "shape": shape, "local_experts": layer.num_local_experts,
                        "expert_path": layer.expert_path(x0), "transport": why, "times": clock.summary(), **info})
        del layer, block, x0, x1, gout, comm, transport
        if device.type == "cuda":
            torch.cuda.empty_cache()
    nccl = torch.cuda.nccl.version() if device_type == "cuda" else None
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}
    return {"results": results, "env": env, "versions": versions, "device": str(device),
            "gpu": torch.cuda.get_device_name(device) if device_type == "cuda" else None}
