"""Turn a GenerateRequest into one consistent set of choices: fill in what follows from the request,
adjust what can be adjusted (each with a note), and collect what must be refused (with rule ids and
the nearest request that would work). The policy table is docs/generate.md; this file implements it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.generate import pipeline, upstream
from moe_overlap.skill.generate.model import GenerateRequest
from moe_overlap.skill.models.recipes import gpu_family
from moe_overlap.skill.models.shapes import ModelShape, UnknownModel, get_model
from moe_overlap.skill.rules.environment import parse_gpu
from moe_overlap.skill.rules.flex_backend import BACKENDS, backend_supported
from moe_overlap.skill.rules.versions import at_least, is_version_number, select_core

STAGES = ("baseline", "overlap", "overlap+wgrad", "flex")


class GenerateError(ValueError):
    """A request that is malformed (not merely unsatisfiable): names the field and the fix."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 choices: list[str] | None = None):
        super().__init__(message)
        self.message, self.field, self.fix, self.choices = message, field, fix, choices


@dataclass
class Adjustment:
    field: str
    requested: Any
    used: Any
    rule: str | None
    reason: str


@dataclass
class Refusal:
    rule: str
    reason: str
    nearest: dict[str, Any]  # request fields to change


@dataclass
class Resolved:
    """Every choice the stage builder needs, after adjustments."""

    experts: int
    ep: int
    topk: int | None
    num_layers: int | None
    shape: ModelShape | None
    precision: str
    tp: int
    pp: int
    vpp: int | None
    dp: int
    dispatcher: str
    backend: str | None
    stages: list[str]
    recompute: str = "none"
    micro_batches: int | None = None
    micro_batch_size: int = 1
    write_batch: bool = False  # train.micro_batch_size / global_batch_size (DP known, or micro-batches asked)
    layout: str | None = None  # pipeline_model_parallel_layout
    mtp: int | None = None  # mtp_num_layers written
    preferred_backend: str | None = None  # the Bridge recipe's flex backend
    adjustments: list[Adjustment] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_divisor(n: int, target: int) -> int:
    """The divisor of `n` (>= 2) closest to `target`; ties go to the smaller one (fewer GPUs)."""
    return min((d for d in divisors(n) if d >= 2), key=lambda d: (abs(d - target), d))


def _gpu(req: GenerateRequest) -> tuple[str | None, str | None]:
    if req.gpu is None:
        return None, None
    try:
        return parse_gpu(req.gpu)
    except ConfigError as exc:
        raise GenerateError(exc.message, field="gpu", fix=exc.fix, choices=exc.choices) from None


def _model(req: GenerateRequest) -> tuple[ModelShape | None, int, int | None, int | None]:
    shape = None
    if req.model is not None:
        try:
            shape = get_model(req.model, trainable_only=True)
        except UnknownModel as exc:
            raise GenerateError(str(exc), field="model", choices=exc.choices) from None
    experts = req.experts if req.experts is not None else (shape.num_moe_experts if shape else None)
    if experts is None:
        raise GenerateError("experts: the number of experts is required", field="experts",
                            fix="give --experts N, or --model NAME")
    if shape and req.experts is not None and req.experts != shape.num_moe_experts:
        raise GenerateError(f"experts={req.experts} contradicts model {shape.name} "
                            f"({shape.num_moe_experts} experts)", field="experts", fix="drop --experts or --model")
    topk = req.topk if req.topk is not None else (shape.moe_router_topk if shape else None)
    if topk is not None and topk > experts:
        raise GenerateError(f"topk={topk} exceeds the number of experts ({experts})", field="topk",
                            fix=f"use a top-k between 1 and {experts}")
    if shape and req.num_layers is not None and req.num_layers != shape.num_layers:
        raise GenerateError(f"num_layers={req.num_layers} contradicts model {shape.name} ({shape.num_layers} "
                            "layers)", field="num_layers", fix="drop --num-layers or --model")
    layers = req.num_layers if req.num_layers is not None else (shape.num_layers if shape else None)
    return shape, experts, topk, layers


def _layout(req: GenerateRequest, experts: int, tp: int, up: upstream.Upstream) -> tuple[int, int]:
    """(ep, dp). EP from the request, the Bridge recipe at this GPU count and PP, or the largest size dividing
    both the experts and TP x DP (experts are not tensor-parallel: expert_tensor_parallel_size 1, as Bridge's
    MoE recipes set it, so EP may span the TP ranks too)."""
    width = tp * req.pp
    dp = None
    if req.gpus is not None:
        if req.gpus % width:
            raise GenerateError(f"gpus={req.gpus} is not divisible by TP x PP = {width}", field="gpus",
                                fix="use a GPU count that is a multiple of tp x pp")
        dp = req.gpus // width
    if req.ep is not None:
        ep = req.ep
        if dp is not None and (tp * dp) % ep:
            raise GenerateError(f"ep={ep} does not divide TP x DP = {tp * dp} (gpus / pp)", field="ep",
                                fix=f"use an EP size dividing {tp * dp}: {divisors(tp * dp)}")
    elif dp is not None:
        r = up.exact
        if r is not None and r.tp == tp and (tp * dp) % r.ep == 0 and experts % r.ep == 0:
            ep = r.ep
            up.notes.append(f"EP {ep} as in {r.where}")
        else:
            ep = math.gcd(experts, tp * dp)
    else:
        raise GenerateError("ep: the expert-parallel size is required", field="ep",
                            fix="give --ep N, or --model NAME with --gpus N")
    return ep, dp if dp is not None else ep


def _pipeline(req: GenerateRequest, layers: int | None, out: Resolved, up: upstream.Upstream) -> None:
    if req.pp == 1:
        if req.vpp is not None:
            out.adjustments.append(Adjustment("vpp", req.vpp, None, None,
                                              "virtual pipeline stages need pipeline parallelism (pp > 1): dropped"))
        return
    if layers is None:
        raise GenerateError("num_layers: needed with pp > 1 to choose the virtual pipeline size",
                            field="num_layers", fix="give --num-layers N, or --model NAME")
    chosen, adjustments, refusals = pipeline.choose(req, layers, out.mtp or 0, up.vpp_from)
    out.vpp, out.layout = chosen["vpp"], chosen["layout"]
    out.adjustments += [Adjustment(*a) for a in adjustments]
    out.refusals += [Refusal(*r) for r in refusals]


def _flex(req: GenerateRequest, out: Resolved) -> None:
    wants_flex = out.dispatcher == "flex" or "flex" in out.stages
    if req.flex_backend and not wants_flex:
        out.notes.append(f"flex_backend={req.flex_backend} is not used: only the flex stage or "
                         "dispatcher=flex switch to the flex dispatcher (flex-backend-needs-flex-dispatcher)")
        return
    if not wants_flex:
        return
    name, cc = _gpu(req)
    support = {b: (backend_supported(b, name, cc) if cc else None) for b in BACKENDS}
    wanted = req.flex_backend
    first = wanted or out.preferred_backend  # the one asked for, else the Bridge recipe's
    order = [first] + [b for b in BACKENDS if b != first] if first else list(BACKENDS)
    pick = next((b for b in order if support[b] is True), None) or next(
        (b for b in order if support[b] is None), None)
    if pick is None:
        reason = f"neither DeepEP nor HybridEP supports GPU {req.gpu} (compute capability {cc})"
        if out.dispatcher == "flex" or (req.stage == "flex" and not req.plan):
            nearest: dict[str, Any] = {"dispatcher": "alltoall", "flex_backend": None}
            if req.stage == "flex":
                nearest["stage"] = "overlap+wgrad"
            out.refusals.append(Refusal("flex-backend-gpu-support", reason, nearest))
        else:
            out.stages.remove("flex")
            out.adjustments.append(Adjustment("stage", "flex", None, "flex-backend-gpu-support",
                                              reason + ": the flex stage is left out of the plan"))
        return
    if wanted and pick != wanted:
        out.adjustments.append(Adjustment("flex_backend", wanted, pick, "flex-backend-gpu-support",
                                          f"{wanted} does not support GPU {req.gpu}; {pick} does"))
    elif not wanted and out.preferred_backend and pick == out.preferred_backend:
        pass  # the recipe's backend: noted with the dispatcher
    elif not wanted and pick != BACKENDS[0]:
        out.notes.append(f"flex backend {pick}: {BACKENDS[0]} does not support GPU {req.gpu}")
    elif support[pick] is None:
        out.notes.append(f"flex backend {pick}: GPU support not checked (give --gpu NAME); on an unsupported GPU "
                         "Megatron-Bridge's config validation raises ValueError (apply_flex_dispatcher_backend "
                         "falls back to alltoall instead)")
    out.backend = pick
    if req.plan and req.dispatcher == "flex" and "flex" in out.stages:
        out.stages.remove("flex")
        out.notes.append("dispatcher=flex already applies to every stage: the separate flex stage is left out")


def resolve(req: GenerateRequest) -> Resolved:
    name, cc = _gpu(req)  # an unknown GPU name is a malformed request, whatever the stage
    for field_name in ("torch_version", "te_version", "megatron_core_version"):
        value = getattr(req, field_name)
        if value is not None and not is_version_number(value):
            raise GenerateError(f"{field_name} {value!r} is not a version number", field=field_name, fix="e.g. 2.6.0")
    shape, experts, topk, layers = _model(req)
    up = upstream.find(shape.name if shape else None, gpu_family(name, cc), req.gpus, req.pp)
    tp = upstream.default_tp(up, req.tp, req.gpus, req.pp)
    ep, dp = _layout(req, experts, tp, up)
    dispatcher, backend = upstream.default_dispatcher(up, req.dispatcher, shape.name if shape else None,
                                                      req.gpu is not None)
    mbs, micro = upstream.default_micro_batches(up, req.micro_batches, dp, req.pp, ep, tp)
    out = Resolved(experts=experts, ep=ep, topk=topk, num_layers=layers, shape=shape, precision=req.precision,
                   tp=tp, pp=req.pp, vpp=None, dp=dp, dispatcher=dispatcher, backend=None,
                   stages=list(STAGES) if req.plan else [req.stage], recompute=req.recompute,
                   micro_batches=micro, micro_batch_size=mbs, preferred_backend=backend,
                   write_batch=req.micro_batches is not None or req.gpus is not None or shape is not None)
    if shape is not None and shape.mtp_num_layers:
        # MTP with EP overlap: at most one layer (mtp-layers-limit); <= 0.17 also needs pp > 1 (mtp-requires-pp)
        if req.pp > 1 or select_core(req.megatron_core_version).line >= (0, 18):
            out.mtp = min(shape.mtp_num_layers, 1)
        else:
            out.notes.append(f"{shape.name} trains with {shape.mtp_num_layers} MTP layer(s); mtp_num_layers is not "
                             "written: megatron-core <= 0.17 needs pp > 1 for MTP with EP overlap (mtp-requires-pp; "
                             "give --pp, or --megatron-core-version 0.18 or later)")
    if experts < 2:
        out.refusals.append(Refusal("num-experts-gt-1", f"num_moe_experts={experts}: a model with one expert has "
                                    "no expert all-to-all to overlap", {"experts": max(2, ep)}))
    elif ep < 2:
        out.refusals.append(Refusal("ep-size-gt-1", "expert_model_parallel_size=1: there is no expert all-to-all "
                                    "to overlap", {"ep": nearest_divisor(experts, 2), "gpus": None}))
    elif experts % ep:
        out.refusals.append(Refusal("ep-divides-experts", f"ep={ep} does not divide {experts} experts: every EP "
                                    "rank must hold the same number of experts",
                                    {"ep": nearest_divisor(experts, ep), "gpus": None}))
    if req.precision == "fp32":
        out.precision = "bf16"
        out.adjustments.append(Adjustment("precision", "fp32", "bf16", "precision-bf16-or-fp16",
                                          "EP overlap needs bf16 or fp16; bf16 needs no loss scaling. The baseline "
                                          "uses bf16 too, so the loss comparison stays like for like"))
    if req.recompute == "full":
        out.refusals.append(Refusal("no-full-recompute", "full activation recomputation cannot run with EP "
                                    "overlap (it also forbids recompute_method and recompute_num_layers)",
                                    {"recompute": "selective"}))
    if req.torch_version is not None and not at_least(req.torch_version, "2.6.0"):
        out.refusals.append(Refusal("torch-min-2-6", f"EP overlap hangs with torch {req.torch_version} (< 2.6.0)",
                                    {"torch_version": "2.6.0"}))
    _pipeline(req, layers, out, up)
    _flex(req, out)
    if up.exact and up.exact.recompute == "full":
        out.notes.append(f"{up.exact.where} fits memory with full recompute, which EP overlap forbids "
                         "(no-full-recompute): this config keeps its layout without it; see the memory note")
    out.notes += up.notes
    return out
