"""Words of the estimator: the assumptions it states, and its result as text for people (torch-free)."""

from __future__ import annotations

from moe_overlap.skill.estimate.model import EstimateRequest, EstimateResult, ResolvedHardware, ep_per_node


def assumptions(req: EstimateRequest, h: ResolvedHardware) -> list[str]:
    node = min(req.ep, ep_per_node(req))
    out = [
        "balanced routing: every rank sends and receives tokens*topk routed tokens per all-to-all, "
        "spread uniformly over the EP ranks (real routers are uneven: the slowest rank sets the pace)",
        "alltoall dispatcher: one copy per (token, expert) pair crosses the link; DeepEP/HybridEP "
        "deduplicate per rank/node and move less",
        f"EP ranks are packed into nodes: {node} of the {req.ep} EP ranks share a node; 1/{req.ep} of the "
        f"traffic stays on the rank, {node - 1}/{req.ep} uses the intra-node link, the rest the inter-node link",
        "one all-to-all takes max(intra bytes / intra bandwidth, inter bytes / inter bandwidth) + a fixed "
        "latency; intra- and inter-node transfers proceed at once",
        (f"achieved all-to-all bandwidth = nominal x {h.a2a_efficiency:.2f}" if not req.calibration or req.fabric
         or req.intra_gbps else "all-to-all bandwidth and latency as calibrated (achieved, not nominal)"),
        "expert FLOPs per routed token: forward 6*D*F (w1 [D,2F]: 4*D*F, w2 [F,D]: 2*D*F); backward dgrad "
        "6*D*F and wgrad 6*D*F; SwiGLU's elementwise work counted as memory traffic",
        f"expert GEMMs at {h.expert_tflops:g} TFLOP/s at every chunk size (smaller chunks run slower in "
        "practice: the chunked estimate is optimistic for many chunks)",
        (f"row gathers and weighting (permute, sort, unsort, unpermute) cost the calibrated {h.perm_ns_per_elem:g} ns per routed "
         "token per D element (forward + backward)" if h.perm_ns_per_elem is not None
         else "row gathers (permute, sort, unsort, unpermute) read and write 8*D elements per routed token in "
         "each pass" + (_mem_rates(h) if h.mem_gbps else ": not modelled (no mem_gbps given)")),
        (f"SwiGLU costs the calibrated {h.act_ns_per_elem:g} ns per routed token per F element (forward + backward)" if h.act_ns_per_elem is not None else
         "SwiGLU is one fused kernel: 8*F elements per routed token (forward 3F, backward 5F) at the memory rate"),
        "each weight-gradient pass writes all local expert weight gradients (a chunked backward pays that once "
        "per chunk)" + (f": {h.wgrad_ns_per_weight:g} ns per weight (calibrated)" if h.wgrad_ns_per_weight is not None
                        else ": 3 accesses per weight at the memory rate"),
        (f"attention/dense forward {req.attn_ms or 0:g} ms per layer and micro-batch, backward twice that"
         if req.attn_ms is not None or req.model is None else
         f"attention forward from {req.model}'s shape: its FLOPs at {h.dense_tflops:g} TFLOP/s (sequence "
         f"{req.seq_length or req.tokens}, causal), backward twice that"),
        "the forward dispatch first exchanges token counts (one more all-to-all latency)",
        *([f"SM margin {req.sm_margin}: the expert GEMMs of each 1f1b layer pair run on {req.sm_margin} SMs fewer, "
           f"x{_margin(req.sm_margin):.3f} their time (measured alone on one H200, skill/estimate/costs.py "
           "SM_MARGIN_FILE); the lone first forward and last backward and none keep every SM. It is this "
           "package's layer setting (verify --sm-margin); Megatron-Core's moe_flex_dispatcher_num_sms is a different "
           "knob: the SMs its DeepEP / HybridEP kernels take (transformer_config.py, core 0.19)"]
          if req.sm_margin else []),
        f"overlap efficiency {h.overlap_efficiency:.2f} ({h.efficiency_source}): step = serial - efficiency x "
        "(serial - ideal two-stream makespan); 1.0 means communication never slows compute, 0 that nothing "
        "overlaps (an SM-driven all-to-all beside compute-bound GEMMs)",
        "1f1b: Megatron-Core's pairing (forward of micro-batch k+1 with backward of k, forward layer i with "
        "backward layer L-1-i, first forward and last backward alone); all layers identical",
        "1f1b+wgrad: the backward dispatch waits only for dgrad; expert wgrad runs beside it; its host work is "
        "x1.214 of none's instead of x1.177 with an SM-driven all-to-all, x1.112 instead of x1.109 over copy engines "
        "(host.py)",
        f"dispatcher {req.dispatcher}; all-to-all moved by {req.a2a_engine}"
        + (f"; CUDA_DEVICE_MAX_CONNECTIONS={req.cuda_device_max_connections}"
           if req.cuda_device_max_connections else "; CUDA_DEVICE_MAX_CONNECTIONS not given (assumed > 1)"),
        (f"pipeline bubble (pp {req.pp}, vpp {req.vpp}): (pp - 1) / (vpp x micro-batches) of one no-overlap pass, "
         "added to every schedule, never hidden" if req.pp > 1 else "no pipeline parallelism (pp 1)"),
        ("full recompute: each layer's forward and its two all-to-alls replayed in the backward, never overlapped"
         if req.recompute == "full" else "no recompute"),
        (f"measured no-overlap step {req.baseline_step_ms:g} ms: what the model leaves out of it is added to every "
         "schedule, never hidden" if req.baseline_step_ms else "no measured baseline step given"),
        "not modelled: pipeline point-to-point traffic, tensor/context parallelism, data-parallel gradient reduction, "
        "optimizer step, shared experts, recomputation, kernel launch gaps"
        + (f"; other_ms={req.other_ms:g} per step added unchanged to every schedule" if req.other_ms else ""),
    ]
    if req.model:
        from moe_overlap.skill.estimate.models import model_preset

        p = model_preset(req.model)
        out.append(f"shape of {p.name}: {p.source}" + (f"; {p.note}" if p.note else ""))
    if h.overhead_ms:
        out.append(f"fixed host cost {h.overhead_ms:g} ms per layer and micro-batch (never overlapped)")
    if h.host_ms:
        from moe_overlap.skill.estimate.host import CHUNK_HOST_SHARE, FACTOR_FILES, HOST_FACTORS

        f = HOST_FACTORS[req.a2a_engine]
        out.append(f"host floor: each schedule takes at least the host's issue time, {h.host_ms:g} ms per layer "
                   f"and micro-batch without overlap, x{f['1f1b']:g} for a 1f1b pair "
                   f"(x{f['1f1b+wgrad']:g} with delayed wgrad, all-to-all by {req.a2a_engine}; measured on two H200s, "
                   f"{FACTOR_FILES[0].rsplit('/', 1)[0]}), "
                   f"+{CHUNK_HOST_SHARE:g} per extra chunk")
    else:
        out.append("no host floor (host_ms not given): the host is assumed to issue work faster than the GPU runs "
                   "it; a host-bound layer (small experts, fast links) gains less than predicted")
    return out


def _margin(sm_margin: int) -> float:
    from moe_overlap.skill.estimate.costs import gemm_margin_slowdown

    return gemm_margin_slowdown(sm_margin)


def _mem_rates(h: ResolvedHardware) -> str:
    e = h.mem_efficiency
    if e is None:
        return f" at {h.mem_gbps:g} GB/s"
    return (f"; each kind of memory-bound pass at its measured share of {h.hbm_gbps:g} GB/s HBM: permute/unpermute "
            f"{e.gather:.3f}, sort/unsort {e.sort:.3f}, SwiGLU {e.activation:.3f}, weight-gradient accumulation "
            f"{e.wgrad:.3f} (bytes as counted here; {e.source})")


def render_text(r: EstimateResult) -> str:
    q, p = r.request, r.per_layer
    lines = [
        f"MoE layer: hidden {q.hidden}, ffn {q.moe_ffn}, {q.experts} experts, top-{q.topk}, {q.tokens} tokens/rank, "
        f"EP {q.ep} ({q.gpus_per_node} GPUs/node), {q.micro_batches} micro-batch(es), {q.layers} layer(s), "
        f"{q.precision}",
        f"per layer and micro-batch: experts fwd {p.expert_gflop_fwd:.1f} GFLOP = {p.expert_fwd_ms:.3f} ms "
        f"(bwd 2x); one all-to-all {p.a2a_bytes / 1e6:.1f} MB off-rank ({p.a2a_intra_bytes / 1e6:.1f} intra, "
        f"{p.a2a_inter_bytes / 1e6:.1f} inter) = {p.a2a_ms:.3f} ms + {p.a2a_latency_ms:.3f} ms latency",
        "",
        f"{'schedule':<12}{'step ms':>12}{'exposed comm ms':>18}{'speedup':>10}{'band':>14}",
    ]
    for s in r.schedules:
        flag = ("" if s.available else "  (not available)") + ("  (host-bound)" if s.host_bound else "")
        band = f"{s.speedup_low:.2f}-{s.speedup_high:.2f}x"
        lines.append(f"{s.name:<12}{s.step_ms:>12.3f}{s.exposed_comm_ms:>18.3f}{s.speedup:>9.3f}x{band:>14}{flag}")
    lines += ["", f"recommendation: {r.recommendation} (schedule {r.recommended_schedule}, "
                  f"{r.predicted_speedup:.3f}x predicted)"]
    lines += [f"  - {x}" for x in r.reasons]
    if r.measure_next:
        lines += ["measure next:"] + [f"  - {x}" for x in r.measure_next]
    if r.memory:
        lines += [f"memory: {r.memory}"]
    lines += ["assumptions:"] + [f"  - {x}" for x in r.assumptions]
    lines += ["sources:"] + [f"  - {x}" for x in r.hardware.sources]
    return "\n".join(lines)
