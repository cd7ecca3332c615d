"""Turn a GenerateRequest into one consistent set of choices: fill in what follows from the request,
adjust what can be adjusted (each with a note), and collect what must be refused (with rule ids and
the nearest request that would work). The policy table is docs/generate.md; this file implements it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.generate.model import GenerateRequest
from moe_overlap.skill.generate.presets import ModelPreset, PresetError, get_preset
from moe_overlap.skill.rules.environment import parse_gpu
from moe_overlap.skill.rules.flex_backend import BACKENDS, backend_supported
from moe_overlap.skill.rules.versions import at_least, is_version_number

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
    preset: ModelPreset | None
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
    adjustments: list[Adjustment] = field(default_factory=list)
    refusals: list[Refusal] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def nearest_divisor(n: int, target: int) -> int:
    """The divisor of `n` (>= 2) closest to `target`; ties go to the smaller one (fewer GPUs)."""
    return min((d for d in divisors(n) if d >= 2), key=lambda d: (abs(d - target), d))


def vpp_choices(num_layers: int, pp: int) -> list[int]:
    """VPP sizes >= 2 that split `num_layers` evenly over pp x vpp virtual stages."""
    return [v for v in range(2, num_layers // pp + 1) if num_layers % (pp * v) == 0]


def _gpu(req: GenerateRequest) -> tuple[str | None, str | None]:
    if req.gpu is None:
        return None, None
    try:
        return parse_gpu(req.gpu)
    except ConfigError as exc:
        raise GenerateError(exc.message, field="gpu", fix=exc.fix, choices=exc.choices) from None


def _model(req: GenerateRequest) -> tuple[ModelPreset | None, int, int | None, int | None]:
    preset = None
    if req.preset is not None:
        try:
            preset = get_preset(req.preset)
        except PresetError as exc:
            raise GenerateError(str(exc), field="preset", choices=exc.choices) from None
    experts = req.experts if req.experts is not None else (preset.num_moe_experts if preset else None)
    if experts is None:
        raise GenerateError("experts: the number of experts is required", field="experts",
                            fix="give --experts N, or --preset NAME")
    if preset and req.experts is not None and req.experts != preset.num_moe_experts:
        raise GenerateError(f"experts={req.experts} contradicts preset {preset.name} "
                            f"({preset.num_moe_experts} experts)", field="experts", fix="drop --experts or --preset")
    topk = req.topk if req.topk is not None else (preset.moe_router_topk if preset else None)
    if topk is not None and topk > experts:
        raise GenerateError(f"topk={topk} exceeds the number of experts ({experts})", field="topk",
                            fix=f"use a top-k between 1 and {experts}")
    layers = req.num_layers if req.num_layers is not None else (preset.num_layers if preset else None)
    return preset, experts, topk, layers


def _layout(req: GenerateRequest, experts: int) -> tuple[int, int]:
    """(ep, dp). EP from the request, or the largest size dividing both the experts and the DP size."""
    width = req.tp * req.pp
    dp = None
    if req.gpus is not None:
        if req.gpus % width:
            raise GenerateError(f"gpus={req.gpus} is not divisible by TP x PP = {width}", field="gpus",
                                fix="use a GPU count that is a multiple of tp x pp")
        dp = req.gpus // width
    if req.ep is not None:
        ep = req.ep
        if dp is not None and dp % ep:
            raise GenerateError(f"ep={ep} does not divide the data-parallel size {dp} (gpus / (tp x pp))",
                                field="ep", fix=f"use an EP size dividing {dp}: {divisors(dp)}")
    elif dp is not None:
        ep = math.gcd(experts, dp)
    else:
        raise GenerateError("ep: the expert-parallel size is required", field="ep",
                            fix="give --ep N, or --preset NAME with --gpus N")
    return ep, dp if dp is not None else ep


def _pipeline(req: GenerateRequest, layers: int | None, out: Resolved) -> None:
    if req.pp == 1:
        if req.vpp is not None:
            out.adjustments.append(Adjustment("vpp", req.vpp, None, None,
                                              "virtual pipeline stages need pipeline parallelism (pp > 1): dropped"))
        return
    if layers is None:
        raise GenerateError("num_layers: needed with pp > 1 to choose the virtual pipeline size",
                            field="num_layers", fix="give --num-layers N, or --preset NAME")
    choices = vpp_choices(layers, req.pp)
    if not choices:
        smaller = [p for p in range(req.pp - 1, 0, -1) if p == 1 or vpp_choices(layers, p)]
        out.refusals.append(Refusal("pp-requires-vpp", (
            f"pp={req.pp} with {layers} layers leaves no room for a virtual pipeline (VPP >= 2 with "
            f"{layers} % (pp x vpp) == 0), and EP overlap with pp > 1 needs one"), {"pp": smaller[0], "vpp": None}))
    elif req.vpp is None:
        out.vpp = choices[0]
        out.adjustments.append(Adjustment("vpp", None, out.vpp, "pp-requires-vpp", (
            f"EP overlap with pp > 1 needs the interleaved schedule: VPP {out.vpp} is the smallest size that "
            f"splits {layers} layers evenly over {req.pp} x VPP stages")))
    elif req.vpp in choices:
        out.vpp = req.vpp
    else:
        out.refusals.append(Refusal("pp-requires-vpp", (
            f"vpp={req.vpp} does not split {layers} layers evenly over pp={req.pp} (valid: {choices})"),
            {"vpp": min(choices, key=lambda v: (abs(v - req.vpp), v))}))


def _flex(req: GenerateRequest, out: Resolved) -> None:
    wants_flex = req.dispatcher == "flex" or "flex" in out.stages
    if req.flex_backend and not wants_flex:
        out.notes.append(f"flex_backend={req.flex_backend} is not used: only the flex stage or "
                         "dispatcher=flex switch to the flex dispatcher (flex-backend-needs-flex-dispatcher)")
        return
    if not wants_flex:
        return
    name, cc = _gpu(req)
    support = {b: (backend_supported(b, name, cc) if cc else None) for b in BACKENDS}
    wanted = req.flex_backend
    order = [wanted] + [b for b in BACKENDS if b != wanted] if wanted else list(BACKENDS)
    pick = next((b for b in order if support[b] is True), None) or next(
        (b for b in order if support[b] is None), None)
    if pick is None:
        reason = f"neither DeepEP nor HybridEP supports GPU {req.gpu} (compute capability {cc})"
        if req.dispatcher == "flex" or (req.stage == "flex" and not req.plan):
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
    _gpu(req)  # an unknown GPU name is a malformed request, whatever the stage
    for name in ("torch_version", "te_version", "megatron_core_version"):
        value = getattr(req, name)
        if value is not None and not is_version_number(value):
            raise GenerateError(f"{name} {value!r} is not a version number", field=name, fix="e.g. 2.6.0")
    preset, experts, topk, layers = _model(req)
    ep, dp = _layout(req, experts)
    out = Resolved(experts=experts, ep=ep, topk=topk, num_layers=layers, preset=preset, precision=req.precision,
                   tp=req.tp, pp=req.pp, vpp=None, dp=dp, dispatcher=req.dispatcher, backend=None,
                   stages=list(STAGES) if req.plan else [req.stage], recompute=req.recompute,
                   micro_batches=req.micro_batches)
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
    _pipeline(req, layers, out)
    _flex(req, out)
    if req.micro_batches == 1:
        out.notes.append("micro_batches=1: EP overlap pairs the forward of one micro-batch with the backward of "
                         "another, so a single micro-batch leaves nothing to overlap (single-micro-batch)")
    if preset is not None and preset.mtp_num_layers:
        out.notes.append(f"{preset.name} trains with {preset.mtp_num_layers} MTP layer(s); mtp_num_layers is not "
                         "written: EP overlap allows at most 1 (mtp-layers-limit) and megatron-core <= 0.17 also "
                         "needs pp > 1 with it (mtp-requires-pp)")
    return out
