"""The measured sections of benchmarks/gpu/gpu_layer.py: experts, permutation, layer, megatron-core, step."""

from __future__ import annotations

import itertools
import statistics

import torch

from benchmarks.common.timing import cuda_time, env, host_syncs, profile_iter, rel


def expert_gemms(x, a, dy, dh, w1, w2, offs, counts=None, path="grouped_mm") -> tuple:
    """The six GEMMs of one expert forward + backward (18*S*D*F flops), no SwiGLU, no autograd.

    x [S, D], a [S, F] (SwiGLU output), dy [S, D], dh [S, 2F] (SwiGLU input gradient), w1 [L, D, 2F],
    w2 [L, F, D]; offs: int32 group end offsets. Forward x@w1, a@w2; dgrad dy@w2^T, dh@w1^T; wgrad x^T dh,
    a^T dy (returned in that order). path 'loop' (per-expert ``@``, where ``torch._grouped_mm`` is
    unsupported) needs host counts.
    """
    if path == "grouped_mm":
        gmm = torch._grouped_mm
        return (gmm(x, w1, offs=offs), gmm(a, w2, offs=offs), gmm(dy, w2.transpose(-2, -1), offs=offs),
                gmm(dh, w1.transpose(-2, -1), offs=offs), gmm(x.t(), dh, offs=offs), gmm(a.t(), dy, offs=offs))
    from moe_overlap.ep.experts import _gmm, _gmm_wgrad

    return (_gmm(x, w1, counts, "loop"), _gmm(a, w2, counts, "loop"), _gmm(dy, w2.transpose(-2, -1), counts, "loop"),
            _gmm(dh, w1.transpose(-2, -1), counts, "loop"), _gmm_wgrad(x, dh, counts, "loop"),
            _gmm_wgrad(a, dy, counts, "loop"))


def bench_experts(shape: dict) -> dict:
    from moe_overlap.ep import experts as ex

    D, F, L = shape["hidden"], shape["ffn"], shape["experts"]
    S = shape["tokens"] * shape["topk"]
    counts = tuple([S // L] * L)
    dev, bf = "cuda", torch.bfloat16
    gen = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(S, D, device=dev, dtype=bf, generator=gen)
    dy = torch.randn(S, D, device=dev, dtype=bf, generator=gen)
    mod = ex.GroupedExperts(L, D, F, dtype=bf, device=dev)
    with torch.no_grad():
        mod.w1.normal_(0, D**-0.5, generator=gen)
        mod.w2.normal_(0, F**-0.5, generator=gen)
    w1, w2 = mod.w1.detach(), mod.w2.detach()
    flops = 18 * S * D * F
    out = {"rows": S, "counts": counts[0], "flops": flops, "path": mod.path_for(x)}

    offs = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=dev)
    a = torch.randn(S, F, device=dev, dtype=bf, generator=gen)
    dh = torch.randn(S, 2 * F, device=dev, dtype=bf, generator=gen)

    def raw():
        expert_gemms(x, a, dy, dh, w1, w2, offs)

    xl = x.clone().requires_grad_()

    def ours():
        mod.w1.grad = mod.w2.grad = xl.grad = None
        mod(xl, counts).backward(dy)

    def tflops(t):
        return round(flops / (t["median_ms"] * 1e-3) / 1e12, 1)

    t_raw = cuda_time(raw)
    out["raw_grouped_mm"] = {**t_raw, "tflops": tflops(t_raw)}
    # What chunking costs the GEMMs alone: the same 6 grouped GEMMs over S/C rows, C times.
    for c in (2, 4):
        part = S // c
        offs_c = torch.tensor(list(itertools.accumulate([part // L] * L)), dtype=torch.int32, device=dev)

        def raw_split(part=part, offs_c=offs_c, c=c):
            for i in range(c):
                sl = slice(i * part, (i + 1) * part)
                expert_gemms(x[sl], a[sl], dy[sl], dh[sl], w1, w2, offs_c)

        t = cuda_time(raw_split)
        out[f"raw_grouped_mm_{c}_chunks"] = {**t, "tflops": tflops(t)}
    # What accumulating one more chunk's expert weight gradient costs (dw += dw_chunk, bf16).
    acc = [torch.randn_like(w1), torch.randn_like(w2), torch.randn_like(w1), torch.randn_like(w2)]

    def add():
        acc[0].add_(acc[2])
        acc[1].add_(acc[3])

    t = cuda_time(add)
    out["wgrad_accumulate_one_chunk"] = {**t, "bytes": 3 * (w1.numel() + w2.numel()) * 2}
    acc.clear()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    t_ours = cuda_time(ours)
    out["ours"] = {**t_ours, "tflops": tflops(t_ours),
                   "peak_extra_bytes": torch.cuda.max_memory_allocated() - base}
    out["ours_vs_raw"] = round(t_raw["median_ms"] / t_ours["median_ms"], 3)
    with env("MOE_OVERLAP_FUSED", "0"):
        t = cuda_time(ours)
        out["ablation_torch_swiglu"] = {**t, "tflops": tflops(t)}
    saved = ex._offsets
    ex._offsets = lambda c, d: torch.tensor(list(itertools.accumulate(c)), dtype=torch.int32, device=d)
    try:
        t = cuda_time(ours)
        out["ablation_pageable_offsets"] = {**t, "tflops": tflops(t)}
        with env("MOE_OVERLAP_FUSED", "0"):
            t = cuda_time(ours)
            out["ablation_before_fixes"] = {**t, "tflops": tflops(t)}
    finally:
        ex._offsets = saved
    # Correctness: bf16 path vs an fp32 reference on the same bf16 inputs (per-expert loop).
    mod.w1.grad = mod.w2.grad = xl.grad = None
    y = mod(xl, counts)
    y.backward(dy)
    xr, w1r, w2r = (t.detach().float().requires_grad_() for t in (x, w1, w2))
    ys, st = [], 0
    for j, c in enumerate(counts):
        hj = xr[st:st + c] @ w1r[j]
        ys.append((torch.nn.functional.silu(hj[:, :F]) * hj[:, F:]) @ w2r[j])
        st += c
    yr = torch.cat(ys)
    yr.backward(dy.float())
    out["rel_err_vs_fp32"] = {"y": rel(y, yr), "dx": rel(xl.grad, xr.grad), "dw1": rel(mod.w1.grad, w1r.grad),
                              "dw2": rel(mod.w2.grad, w2r.grad)}
    return out


def bench_permute(shape: dict, copy_gbps: float) -> dict:
    from moe_overlap.ep import dispatcher as dp
    from moe_overlap.ep.router import balanced_assignment

    T, K, D, E = shape["tokens"], shape["topk"], shape["hidden"], shape["experts"]
    N, dev, bf = T * K, "cuda", torch.bfloat16
    experts_TK = balanced_assignment(T, K, E, dev)
    plan = dp.plan_permute(experts_TK, E)
    x = torch.randn(T, D, device=dev, dtype=bf)
    y = torch.randn(N, D, device=dev, dtype=bf)
    g = torch.randn(T, D, device=dev, dtype=bf)
    probs = torch.rand(T, K, device=dev)
    e2 = 2  # bytes per bf16 element
    ops = {  # name: (fn, minimal bytes)
        "permute": (lambda: dp.permute_rows(x, plan), T * D * e2 + N * D * e2),
        "permute_backward": (lambda: dp.permute_rows_backward(y, plan), N * D * e2 + T * D * e2),
        "unpermute": (lambda: dp.unpermute_rows(y, probs, plan), N * D * e2 + N * 4 + T * D * e2),
        "unpermute_backward": (lambda: dp.unpermute_rows_backward(g, y, probs, plan),
                               T * D * e2 + N * D * e2 + N * 4 + N * D * e2 + N * 4),
        # EP 1: the weights applied by the experts (dispatcher.py), so the combine only sums and its
        # backward is a gather of g, without reading y.
        "unpermute_unweighted": (lambda: dp.unpermute_rows(y, None, plan), N * D * e2 + T * D * e2),
        "unpermute_unweighted_backward": (lambda: dp.unpermute_rows_backward(g, None, None, plan),
                                          T * D * e2 + N * D * e2),
    }
    res = {"sweep": sweep_unpermute(y, g, probs, plan, ops["unpermute"][1], ops["unpermute_backward"][1],
                                    copy_gbps)}
    for name, (fn, nbytes) in ops.items():
        row = {"min_bytes": nbytes}
        for variant, flag in (("fused", "1"), ("torch", "0")):
            with env("MOE_OVERLAP_FUSED", flag):
                t = cuda_time(fn, iters=20)
            gbps = nbytes / (t["median_ms"] * 1e-3) / 1e9
            row[variant] = {**t, "GBps": round(gbps, 1), "frac_copy": round(gbps / copy_gbps, 3)}
        res[name] = row
    # fused vs torch agree (same fp32 math, possibly another summation order)
    with env("MOE_OVERLAP_FUSED", "0"):
        ref_u, (ref_g, ref_p) = dp.unpermute_rows(y, probs, plan), dp.unpermute_rows_backward(g, y, probs, plan)
        ref_pb = dp.permute_rows_backward(y, plan)
    got_u, (got_g, got_p) = dp.unpermute_rows(y, probs, plan), dp.unpermute_rows_backward(g, y, probs, plan)
    res["fused_vs_torch_rel_err"] = {"unpermute": rel(got_u, ref_u), "unpermute_bwd_g": rel(got_g, ref_g),
                                     "unpermute_bwd_probs": rel(got_p, ref_p),
                                     "permute_bwd": rel(dp.permute_rows_backward(y, plan), ref_pb)}
    return res


def sweep_unpermute(y, g, probs, plan, fwd_bytes, bwd_bytes, copy_gbps) -> dict:
    """Fraction of copy bandwidth of the un-permute kernels for a few tile widths and warp counts."""
    from moe_overlap.ep import fused

    out = {}
    for block_d, warps in itertools.product((256, 512, 1024, 2048), (4, 8)):
        t_f = cuda_time(lambda b=block_d, w=warps: fused.weighted_gather_sum(
            y, plan.inv_perm_N, probs, plan.num_tokens, plan.topk, block_d=b, num_warps=w), iters=20)
        t_b = cuda_time(lambda b=block_d, w=warps: fused.weighted_gather_sum_backward(
            g, y, plan.inv_perm_N, probs, block_d=b, num_warps=w), iters=20)
        out[f"d{block_d}_w{warps}"] = {
            "fwd_frac_copy": round(fwd_bytes / (t_f["median_ms"] * 1e-3) / 1e9 / copy_gbps, 3),
            "bwd_frac_copy": round(bwd_bytes / (t_b["median_ms"] * 1e-3) / 1e9 / copy_gbps, 3)}
    return out


def syncs_only(shape: dict, group) -> dict:
    """Host syncs of one layer forward+backward, forced-balance and top-k routing, none and chunked."""
    from moe_overlap.ep.layer import MoELayer

    D, F, E, T, K = shape["hidden"], shape["ffn"], shape["experts"], shape["tokens"], shape["topk"]
    out = {}
    for balance in (True, False):
        layer = MoELayer(D, F, E, K, group, force_balance=balance, dtype=torch.bfloat16, device="cuda")
        x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for schedule, chunks in (("none", 1), ("chunked", 2)):
            def fb(schedule=schedule, chunks=chunks, layer=layer, x=x):
                y, _ = layer(x, schedule=schedule, chunks=chunks)
                y.backward(torch.ones_like(y))
            fb()
            out[f"{schedule}{chunks}_balanced={balance}"] = host_syncs(fb)
    return out


def bench_layer(shape: dict, group) -> dict:
    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.ep.streams import make_comm_stream

    D, F, E, T, K = shape["hidden"], shape["ffn"], shape["experts"], shape["tokens"], shape["topk"]
    layer = MoELayer(D, F, E, K, group, force_balance=True, dtype=torch.bfloat16, device="cuda")
    stream = make_comm_stream("cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    res = {}
    variants = [("none", 1), ("chunked", 2), ("chunked", 4)]
    for schedule, chunks in variants:
        name = schedule if schedule == "none" else f"{schedule}{chunks}"

        def fwd(schedule=schedule, chunks=chunks):
            with torch.no_grad():
                layer(x, schedule=schedule, chunks=chunks, comm_stream=stream)

        def fwd_bwd(schedule=schedule, chunks=chunks):
            layer.zero_grad(set_to_none=True)
            x.grad = None
            out, _ = layer(x, schedule=schedule, chunks=chunks, comm_stream=stream)
            out.backward(g)

        row = {"fwd": cuda_time(fwd)}
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        row["fwd_bwd"] = cuda_time(fwd_bwd)
        row["peak_extra_bytes"] = torch.cuda.max_memory_allocated() - base
        with env("MOE_OVERLAP_FUSED", "0"):
            row["fwd_bwd_torch_elementwise"] = cuda_time(fwd_bwd)
        row["host_syncs_fwd_bwd"] = host_syncs(fwd_bwd)
        if chunks <= 2:
            row["profile_fwd_bwd"] = profile_iter(fwd_bwd)
        res[name] = row
    base = res["none"]["fwd_bwd"]["median_ms"]
    for row in res.values():
        row["fwd_bwd_vs_none"] = round(row["fwd_bwd"]["median_ms"] / base, 3)
    return res


def bench_graph(shape: dict, group, sync_free: bool = False) -> dict:
    """Schedule none eager vs forward and backward replayed from CUDA graphs (moe_overlap/ep/graphed.py): the
    same kernels without the host issuing them one by one. A fresh layer, captured before any profiler runs
    in this section (the profiles come last); the two timed alternately, three times each; bitwise check.
    ``sync_free``: the layer's EP > 1 code path (ep/sync_free.py: device counts, equal-block NCCL all-to-alls,
    compaction by device index math) forced at the group's size, world 1 included, eager and graphed."""
    from moe_overlap.ep.graphed import graph_layer
    from moe_overlap.ep.layer import MoELayer

    D, F, E, T, K = shape["hidden"], shape["ffn"], shape["experts"], shape["tokens"], shape["topk"]
    layer = MoELayer(D, F, E, K, group, force_balance=True, dtype=torch.bfloat16, device="cuda")
    x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)

    def run(call):
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out, _ = call(x)
        out.backward(g)
        return out

    def grads(out):
        return [out.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]

    eager = (lambda v: layer(v, sync_free=True)) if sync_free else layer
    ref = grads(run(eager))
    graphed = graph_layer(layer, x, sync_free=sync_free)
    same = all(torch.equal(a, b) for a, b in zip(grads(run(graphed)), ref, strict=True))
    eager_fb, graph_fb = (lambda: run(eager)), (lambda: run(graphed))
    times = {"eager": [], "graph": []}
    for _ in range(3):
        times["eager"].append(cuda_time(eager_fb))
        times["graph"].append(cuda_time(graph_fb))
    res = {name: {"fwd_bwd_median_ms": statistics.median(t["median_ms"] for t in ts), "runs": ts}
           for name, ts in times.items()}
    res["bitwise_vs_eager"] = same
    res["sync_free"] = sync_free
    res["eager"]["host_syncs_fwd_bwd"] = host_syncs(eager_fb)
    res["graph"]["host_syncs_fwd_bwd"] = host_syncs(graph_fb)
    for name, fn in (("eager", eager_fb), ("graph", graph_fb)):
        prof = profile_iter(fn)
        res[name]["profile"] = {k: v for k, v in prof.items() if not k.startswith("top")}
    res["graph_vs_eager"] = round(res["graph"]["fwd_bwd_median_ms"] / res["eager"]["fwd_bwd_median_ms"], 3)
    return res


def bench_megatron(shape: dict) -> dict:
    """megatron-core MoELayer (local spec: SequentialMLP, no TE) at the same shape, EP 1."""
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import torch.nn.functional as Fn
    from megatron.core import parallel_state
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    # megatron-core 0.16.1 binds te_general_gemm only when Transformer Engine imports, but its router
    # reads the name unconditionally (NameError without TE); None selects its plain torch path.
    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, expert_model_parallel_size=1)
        model_parallel_cuda_manual_seed(0)
    D, F, E, T, K = shape["hidden"], shape["ffn"], shape["experts"], shape["tokens"], shape["topk"]
    cfg = TransformerConfig(
        num_layers=1, hidden_size=D, num_attention_heads=16, ffn_hidden_size=F, moe_ffn_hidden_size=F,
        num_moe_experts=E, moe_router_topk=K, moe_token_dispatcher_type="alltoall", moe_grouped_gemm=False,
        moe_router_force_load_balancing=True, moe_aux_loss_coeff=0.0, moe_router_load_balancing_type="none",
        bf16=True, params_dtype=torch.bfloat16, add_bias_linear=False, gated_linear_unit=True,
        activation_func=Fn.silu, gradient_accumulation_fusion=False, bias_activation_fusion=False,
        moe_router_dtype="fp32")
    spec = get_moe_module_spec(use_te=False, num_experts=E, moe_grouped_gemm=False)
    layer = build_module(spec, config=cfg).cuda().to(torch.bfloat16)
    x = torch.randn(T, 1, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(T, 1, D, device="cuda", dtype=torch.bfloat16)

    def fwd():
        with torch.no_grad():
            layer(x)

    def fwd_bwd():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        out = out[0] if isinstance(out, tuple) else out
        out.backward(g)

    res = {"experts_module": type(layer.experts).__name__, "fwd": cuda_time(fwd), "fwd_bwd": cuda_time(fwd_bwd),
           "why_not_grouped": "GroupedMLP needs the grouped_gemm CUDA extension and TEGroupedMLP needs "
                              "Transformer Engine; neither is installable on the device (no network, no wheel)"}
    return res


def bench_step(group, rounds: int = 40, batch: int | None = None) -> dict:
    """Training step (benchmarks/gpu/step.py's "gpu" model, balanced routing) per schedule, modes interleaved
    round by round; CUDA events; the median over rounds of each mode's time relative to "none"."""
    from benchmarks.gpu.step import PRESETS
    from moe_overlap.ep.model import ModelConfig, MoETransformer
    from moe_overlap.ep.step import forward_backward
    from moe_overlap.ep.streams import make_comm_stream

    preset = dict(PRESETS["gpu"], **({"batch": batch} if batch else {}))
    cfg = ModelConfig(**{k: v for k, v in preset.items() if k not in ("batch", "seq", "micro_batches")},
                      force_balance=True)
    model = MoETransformer(cfg, group).to(device="cuda", dtype=torch.bfloat16)
    stream = make_comm_stream("cuda")
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(preset["micro_batches"]):
        tok = torch.randint(0, cfg.vocab_size, (preset["batch"], preset["seq"] + 1), generator=gen).cuda()
        batches.append((tok[:, :-1].contiguous(), tok[:, 1:].contiguous()))
    modes = {"none": ("none", False), "chunked": ("chunked", False), "1f1b": ("1f1b", False),
             "1f1b+wgrad": ("1f1b", True)}
    times = {m: [] for m in modes}
    peak = dict.fromkeys(modes, 0)

    def step(schedule, delay):
        forward_backward(model, batches, schedule=schedule, delay_wgrad=delay, chunks=2, group=group,
                         streams=stream)

    for r in range(rounds + 2):  # two warm-up rounds
        for name, (schedule, delay) in modes.items():
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(schedule, delay)
            end.record()
            torch.cuda.synchronize()
            if r >= 2:
                times[name].append(start.elapsed_time(end))
                peak[name] = max(peak[name], torch.cuda.max_memory_allocated())
    out = {"config": {**preset, "force_balance": True, "chunks": 2, "dtype": "bfloat16"}, "rounds": rounds, "modes": {}}
    for name in modes:
        ratios = [t / n for t, n in zip(times[name], times["none"], strict=True)]
        out["modes"][name] = {"median_ms": statistics.median(times[name]), "min_ms": min(times[name]),
                              "vs_none_median_of_ratios": round(statistics.median(ratios), 3),
                              "peak_memory_bytes": peak[name]}
        # Where the step is host-bound (GPU busy well under 1), wall time measures host jitter as much as
        # the schedule; the GPU kernel time of a profiled step says what work the schedule adds.
        prof = profile_iter(lambda s=modes[name]: step(*s), iters=2)
        out["modes"][name]["profile"] = {k: v for k, v in prof.items() if not k.startswith("top")}
        out["modes"][name]["profile"]["top_self_cpu"] = prof["top_self_cpu"][:8]
    gpu_none = out["modes"]["none"]["profile"]["gpu_kernel_ms"]
    for row in out["modes"].values():
        row["gpu_kernel_vs_none"] = round(row["profile"]["gpu_kernel_ms"] / gpu_none, 3)
    return out
