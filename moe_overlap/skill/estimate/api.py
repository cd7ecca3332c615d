"""estimate_overlap_benefit: predict what EP communication overlap buys for a shape, EP degree and fabric.

Torch-free. The model, per MoE layer and micro-batch (all ranks alike: balanced routing):

* expert FLOPs: a routed token meets w1 [D, 2F] (gate and up) and w2 [F, D]: forward 2*D*2F + 2*F*D
  = 6*D*F; backward dgrad 6*D*F and wgrad 6*D*F. Each rank runs T*K routed tokens.
* all-to-all bytes per rank: T*K*D*bytes leave the rank's permute buffer per all-to-all; 1/N stay on
  the rank, (g-1)/N go to the other g-1 GPUs of the node (g = min(EP, GPUs per node)), the rest
  crosses nodes. Four all-to-alls per layer and micro-batch: dispatch and combine, forward and backward.
* link time = max(intra bytes / intra bandwidth, inter bytes / inter bandwidth) + latency.
* schedules are timelines of the layer's nodes on a compute and a comm stream (``skill/estimate/timeline.py``);
  no schedule is faster than the host issuing it, when the host time is known (``skill/estimate/host.py``).

Every assumption is returned in ``EstimateResult.assumptions``.
"""

from __future__ import annotations

from pydantic import ValidationError

from moe_overlap.skill.estimate import costs
from moe_overlap.skill.estimate import hardware as hw
from moe_overlap.skill.estimate.decide import NEGLIGIBLE_SPEEDUP, recommend
from moe_overlap.skill.estimate.host import floor_ms, host_bound_note
from moe_overlap.skill.estimate.model import (
    BYTES,
    Calibration,
    EstimateRequest,
    EstimateResult,
    MemoryEfficiency,
    PerLayer,
    ResolvedHardware,
    ep_per_node,
)
from moe_overlap.skill.estimate.models import MODELS, model_preset
from moe_overlap.skill.estimate.resolve import MissingInputs, resolve
from moe_overlap.skill.estimate.schedules import layer_nodes, pair_nodes, schedules
from moe_overlap.skill.estimate.timeline import TimelineTooLong, blend, layer_timeline

__all__ = ["NEGLIGIBLE_SPEEDUP", "Calibration", "EstimateError", "EstimateRequest", "EstimateResult",
           "estimate_overlap_benefit", "parse_request"]

class EstimateError(ValueError):
    """A bad request: names the field and the fix."""

    def __init__(self, field: str, message: str, fix: str = "", choices: list[str] | None = None):
        self.field, self.fix, self.choices = field, fix, choices
        super().__init__(f"{field}: {message}")


def check_request(req: EstimateRequest) -> EstimateRequest:
    """Defaults filled in (skill/estimate/resolve.py), every missing input named in one error, then the
    cross-field checks (field-level ranges are pydantic's); raises EstimateError naming the field."""
    try:
        req = resolve(req)
    except MissingInputs as exc:
        choices = sorted(MODELS) if exc.field in ("hidden", "moe_ffn", "experts", "topk") else None
        raise EstimateError(exc.field, str(exc), exc.fix, choices=choices) from None
    if req.topk > req.experts:
        raise EstimateError("topk", f"top-k {req.topk} is larger than the number of experts {req.experts}",
                            "set topk <= experts")
    if req.sm_margin:
        try:
            costs.gemm_margin_slowdown(req.sm_margin)
        except ValueError as exc:
            raise EstimateError("sm_margin", f"{req.sm_margin}: the GEMMs' cost of a margin is {exc}",
                                "give 0-32, or time the GEMMs at that margin (python benchmarks/gpu/gemm_rate.py "
                                "--device cuda --sm-margins N)") from None
    if req.experts % req.ep:
        raise EstimateError("ep", f"EP {req.ep} does not divide the {req.experts} experts",
                            "choose an EP degree that divides experts (rule ep-divides-experts)")
    per_node = ep_per_node(req)
    if req.ep > per_node and req.ep % per_node:
        raise EstimateError("gpus_per_node", f"EP {req.ep} spans nodes but is not a multiple of the {per_node} "
                            f"EP ranks per node ({req.gpus_per_node} GPUs per node, stride {req.ep_stride})",
                            "use whole nodes for an EP group")
    return req


def parse_request(data: dict) -> EstimateRequest:
    """A dict (CLI, MCP, JSON) -> checked request; every error becomes an EstimateError naming the field."""
    try:
        req = EstimateRequest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "request"
        got = repr(err.get("input"))
        got = got if len(got) <= 80 else got[:77] + "..."
        raise EstimateError(field, f"{err['msg']} (got {got})",
                            f"give '{field}' a valid value; see `moe-overlap estimate --help`") from None
    return check_request(req)


def _link(explicit: float | None, preset: hw.LinkPreset | None, cal: Calibration | None, eff: float,
          default_latency_us: float) -> tuple[float | None, float]:
    """(achieved GB/s, latency us) of one link level: explicit or preset nominal x efficiency, else the
    calibration's measured (already achieved) bandwidth and latency."""
    if explicit or preset:
        return (explicit or preset.gbps) * eff, preset.latency_us if preset else default_latency_us
    if cal:
        return cal.a2a_gbps, cal.a2a_latency_us
    return None, default_latency_us


def _hardware(req: EstimateRequest, multi_node: bool) -> ResolvedHardware:
    cal = req.calibration
    sources: list[str] = []
    intra = inter = None
    if req.fabric:
        try:
            intra, inter = hw.parse_fabric(req.fabric)
        except hw.PresetError as exc:
            raise EstimateError("fabric", str(exc).split(": ", 1)[1], choices=exc.choices) from None
        sources += [f"{p.name}: {p.source}" for p in (intra, inter) if p]
    eff = req.a2a_efficiency or hw.DEFAULT_A2A_EFFICIENCY
    intra_gbps, intra_lat = _link(req.intra_gbps, intra, cal, eff, 15.0)
    inter_gbps, inter_lat = _link(req.inter_gbps, inter, cal, eff, 30.0)
    backend = costs.BACKENDS[req.dispatcher]
    if req.dispatcher != "alltoall":  # published achieved rates replace the NCCL estimate (explicit values win)
        intra_gbps = req.intra_gbps or backend.intra_gbps
        inter_gbps = req.inter_gbps or (backend.inter_gbps if inter_gbps or multi_node else None)
        sources.append(f"{backend.name}: {backend.source}")
    if intra_gbps is None:
        raise EstimateError("fabric", "no intra-node bandwidth", "pass fabric (e.g. h100-nvlink+ib-400g), "
                            "intra_gbps, or a calibration", choices=sorted(hw.LINKS))
    if multi_node and inter_gbps is None:
        raise EstimateError("fabric", f"EP {req.ep} spans more than one node ({ep_per_node(req)} EP ranks per node) but no "
                            "inter-node bandwidth is given", "add an inter-node preset (+ib-400g) or inter_gbps",
                            choices=sorted(hw.LINKS))
    gpu = None
    if req.gpu_preset:
        try:
            gpu = hw.gpu_preset(req.gpu_preset)
        except hw.PresetError as exc:
            raise EstimateError("gpu_preset", str(exc).split(": ", 1)[1], choices=exc.choices) from None
        sources.append(f"{gpu.name}: {gpu.source}")
        if req.precision == "fp32":
            raise EstimateError("precision", "GPU presets are bf16/fp16 measurements", "pass tflops for fp32")
    tflops = req.tflops or (gpu.expert_tflops_for(req.model) if gpu else None) or (cal.expert_tflops if cal else None)
    if tflops is None:
        raise EstimateError("gpu_preset", "no GEMM throughput", "pass gpu_preset (h100, h200), tflops, or calibrate",
                            choices=sorted(hw.GPUS))
    dense = req.dense_tflops or (gpu.dense_tflops if gpu else None) or (cal.dense_tflops if cal else None) or tflops
    hbm, mem_eff = _hbm(req, gpu)
    if mem_eff is not None:
        sources.append(f"memory-bound passes at {mem_eff.gather:.3f} (gather), {mem_eff.sort:.3f} (sort), "
                       f"{mem_eff.activation:.3f} (SwiGLU), {mem_eff.wgrad:.3f} (wgrad) of {hbm:g} GB/s HBM "
                       f"({'hbm_gbps' if req.hbm_gbps else gpu.hbm_source}); shares: {mem_eff.source}")
    mem = (hbm * mem_eff.sort if mem_eff else None) or req.mem_gbps or (gpu.mem_gbps if gpu else None) or (
        cal.mem_gbps if cal else None)
    # The calibration's per-element costs describe our kernels on the calibrated machine: used only when
    # no preset or explicit memory rate says which machine this is.
    per_elem = cal if cal and not (gpu or req.mem_gbps or mem_eff) else None
    overhead = req.overhead_ms if req.overhead_ms is not None else (cal.overhead_ms if cal else 0.0)
    host_ms = req.host_ms if req.host_ms is not None else (cal.host_ms if cal else None)
    if host_ms is None and cal is None and req.megatron_host:  # Megatron-Core's layer: its host work from its op count
        host_ms = costs.host_ms_megatron(req.experts, req.ep, req.cuda_graph_scope)
        sources.append(costs.host_source(req.experts, req.ep, req.cuda_graph_scope))
    if cal:
        sources.append(f"calibration: {cal.source}")
    return ResolvedHardware(
        expert_tflops=tflops, dense_tflops=dense, mem_gbps=mem, hbm_gbps=hbm, mem_efficiency=mem_eff,
        intra_gbps=intra_gbps, inter_gbps=inter_gbps, a2a_efficiency=eff,
        act_ns_per_elem=per_elem.act_ns_per_elem if per_elem else None,
        perm_ns_per_elem=per_elem.perm_ns_per_elem if per_elem else None,
        wgrad_ns_per_weight=per_elem.wgrad_ns_per_weight if per_elem else None, overhead_ms=overhead, host_ms=host_ms,
        intra_latency_us=intra_lat, inter_latency_us=inter_lat,
        **_overlap_efficiency(req, intra, inter, multi_node), sources=sources,
    )


def _hbm(req: EstimateRequest, gpu: hw.GpuPreset | None) -> tuple[float | None, MemoryEfficiency | None]:
    """(HBM peak GB/s, shares per kind of pass) when hbm_efficiency is given, else (None, None)."""
    if req.hbm_efficiency is None:
        if req.hbm_gbps is not None:
            raise EstimateError("hbm_gbps", "only applies with hbm_efficiency (the achieved share of that peak)",
                                "add hbm_efficiency (or --mem-rate FILE), or give mem_gbps instead")
        return None, None
    if req.mem_gbps is not None:
        raise EstimateError("hbm_efficiency", "and mem_gbps both set the memory-bound rate", "give one of them")
    hbm = req.hbm_gbps or (gpu.hbm_gbps if gpu else None)
    if not hbm:
        raise EstimateError("hbm_efficiency", "needs the HBM peak of the GPU it applies to",
                            f"name the GPU: gpu_preset ({', '.join(sorted(hw.GPUS))}), or its HBM peak in GB/s as hbm_gbps",
                            choices=sorted(hw.GPUS))
    return hbm, req.hbm_efficiency


def _overlap_efficiency(req: EstimateRequest, intra: hw.LinkPreset | None, inter: hw.LinkPreset | None,
                        multi_node: bool) -> dict:
    """Explicit, else what moves the bytes and the queues (skill/estimate/costs.py) applied to the base."""
    out = _base_efficiency(req, intra, inter, multi_node)
    # the link presets' efficiencies are the share kept of a timeline that holds the GEMMs' second wave
    # (hardware.py); a given or calibrated one is a blend measured with it, so the timeline must not add it again
    out["second_wave"] = (costs.second_wave(req.dispatcher, req.a2a_engine, req.sm_margin)
                          if out.pop("preset", False) else 0.0)
    if req.overlap_efficiency is None:
        eff, why = costs.overlap_efficiency(out["overlap_efficiency"], multi_node=multi_node,
                                            backend=req.dispatcher, a2a_engine=req.a2a_engine,
                                            max_connections=req.cuda_device_max_connections,
                                            sm_margin=req.sm_margin)
        if why:
            out = dict(out, overlap_efficiency=eff, efficiency_source=out["efficiency_source"] + "; " + why)
    return out


def _base_efficiency(req: EstimateRequest, intra: hw.LinkPreset | None, inter: hw.LinkPreset | None,
                     multi_node: bool) -> dict:
    """Explicit, else the link preset that carries the traffic (the inter-node one when EP spans nodes: its
    bandwidth is several times lower, so it sets the all-to-all time), else the calibration, else 1.0."""
    if req.overlap_efficiency is not None:
        return {"overlap_efficiency": req.overlap_efficiency, "efficiency_source": "given"}
    link = inter if multi_node and inter else intra if not multi_node else None
    if link is not None:
        return {"overlap_efficiency": link.overlap_efficiency, "preset": True,
                "efficiency_source": f"{link.name} preset ({link.efficiency_source})"}
    if req.calibration is not None:
        return {"overlap_efficiency": req.calibration.overlap_efficiency,
                "efficiency_source": f"calibration ({req.calibration.source})"}
    return {"overlap_efficiency": 1.0, "efficiency_source": "no link preset or calibration: 1.0, an upper bound"}


def attention_ms(req: EstimateRequest, dense_tflops: float) -> float:
    """attn_ms as given, else a model preset's attention forward FLOPs at the dense rate, else 0."""
    if req.attn_ms is not None:
        return req.attn_ms
    if req.model is None:
        return 0.0
    flops = model_preset(req.model).attn_fwd_flops(req.tokens, req.seq_length or req.tokens)
    return flops / (dense_tflops * 1e12) * 1e3


def _per_layer(req: EstimateRequest, h: ResolvedHardware) -> PerLayer:
    b = BYTES[req.precision]
    d, f, n = req.hidden, req.moe_ffn, req.ep
    routed = req.tokens * req.topk
    node = min(n, ep_per_node(req))
    sent = routed * d * b
    intra_bytes = sent * (node - 1) / n
    inter_bytes = sent * (n - node) / n
    ms = 1e3
    link = max(intra_bytes / (h.intra_gbps * 1e9), inter_bytes / (h.inter_gbps * 1e9) if inter_bytes else 0.0)
    latency = (h.inter_latency_us if inter_bytes else h.intra_latency_us) / 1e3 if n > 1 else 0.0
    gemm_fwd = 6.0 * d * f * routed  # w1: 2*D*2F, w2: 2*F*D per routed token
    router_fwd = 2.0 * req.tokens * d * req.experts
    def at_rate(nbytes: float, kind: str) -> float:
        """ms to move nbytes (as counted here) at the rate of this kind of pass; 0 without a memory rate."""
        if h.mem_efficiency is not None:
            return nbytes / (h.hbm_gbps * getattr(h.mem_efficiency, kind) * 1e9) * ms
        return nbytes / (h.mem_gbps * 1e9) * ms if h.mem_gbps else 0.0

    # Row gathers per routed token, read + write, forward: permute, sort by local expert, unsort,
    # unpermute (2D elements each); the backward moves the same. A calibration's cost per element covers
    # all four (half each to permute/unpermute and sort/unsort).
    if h.perm_ns_per_elem is not None:
        perm_ms = sort_ms = routed * d * h.perm_ns_per_elem / 1e6 / 2
    else:
        perm_ms, sort_ms = at_rate(routed * 8 * d * b, "gather"), at_rate(routed * 8 * d * b, "sort")
    # SwiGLU per routed token: a fused kernel reads 2F and writes F forward, reads 3F and writes 2F
    # backward (8F elements); a calibration measures our own (unfused) kernels' cost per element instead.
    if h.act_ns_per_elem is not None:
        act_ms = routed * f * h.act_ns_per_elem / 1e6
    else:
        act_ms = at_rate(routed * 8 * f * b, "activation")
    weights = req.experts // n * 3 * d * f  # local experts' w1 [D, 2F] + w2 [F, D]
    if h.wgrad_ns_per_weight is not None:
        wgrad_write_ms = weights * h.wgrad_ns_per_weight / 1e6
    else:  # accumulated: dw += dw_pass reads both and writes one (the pass's own write is the GEMM's)
        wgrad_write_ms = at_rate(weights * 3 * b, "wgrad")
    return PerLayer(
        routed_tokens=routed,
        expert_gflop_fwd=gemm_fwd / 1e9, expert_gflop_dgrad=gemm_fwd / 1e9, expert_gflop_wgrad=gemm_fwd / 1e9,
        a2a_bytes=int(sent * (n - 1) / n), a2a_intra_bytes=int(intra_bytes), a2a_inter_bytes=int(inter_bytes),
        a2a_ms=link * ms, a2a_latency_ms=latency,
        expert_fwd_ms=gemm_fwd / (h.expert_tflops * 1e12) * ms,
        router_fwd_ms=router_fwd / (h.dense_tflops * 1e12) * ms,
        permute_ms=perm_ms, sort_ms=sort_ms, activation_ms=act_ms, wgrad_write_ms=wgrad_write_ms, attn_fwd_ms=attention_ms(req, h.dense_tflops),
        overhead_ms=h.overhead_ms,
    )


def chunked_step_ms(req: EstimateRequest) -> float:
    """The in-layer chunked schedule's step (ms), for the CPU benchmark only (benchmarks/estimator/estimate_vs_measured.py):
    not part of the result, whose reasons say why (measured slower than none on NVLink, docs/estimate.md)."""
    req = check_request(req)
    h = _hardware(req, req.ep > ep_per_node(req))
    nodes = layer_nodes(_per_layer(req, h))
    ch = layer_timeline(nodes, req.chunks, req.chunk_backward)
    ms, _ = floor_ms(blend(ch, h.overlap_efficiency) * req.micro_batches * req.layers, h.host_ms, "chunked",
                     req.micro_batches * req.layers, req.chunks)
    return ms + req.other_ms


def estimate_overlap_benefit(req: EstimateRequest) -> EstimateResult:
    """Predict step times without overlap, with ``1f1b`` and ``1f1b+wgrad`` (each with its uncertainty band),
    and recommend."""
    req = check_request(req)
    multi_node = req.ep > ep_per_node(req)
    h = _hardware(req, multi_node)
    p = _per_layer(req, h)
    nodes = layer_nodes(p)
    pair = pair_nodes(p, req.sm_margin)
    lo_e, hi_e = costs.BAND["efficiency"]
    lo_h, hi_h = costs.BAND["host_excess"]
    try:
        out = schedules(req, h, nodes, h.overlap_efficiency, pair=pair)
        low = schedules(req, h, nodes, h.overlap_efficiency * lo_e, lo_h, pair=pair)
        high = schedules(req, h, nodes, min(1.0, h.overlap_efficiency * hi_e), hi_h, pair=pair)
    except TimelineTooLong as exc:
        raise EstimateError("micro_batches", str(exc), "give fewer layers or micro-batches") from None
    for s, a, b in zip(out, low, high, strict=True):
        s.speedup_low, s.speedup_high = min(a.speedup, s.speedup), max(b.speedup, s.speedup)
    host_note = (host_bound_note(h.host_ms, layer_timeline(nodes, 1).serial, req.a2a_engine) if h.host_ms
                 else None)
    return recommend(req, h, p, out, nodes, host_note)
