"""generate_config: minimal working EP-overlap configurations and a staged rollout plan (torch-free).

The seed's advice is the spine: start correctness-first with plain overlap (delayed wgrad off), then add
delayed wgrad, then the flex dispatcher. Every generated stage is validated with `validate_config` in the
request's environment before it is returned; requests that cannot be satisfied are refused with the rule
ids and the nearest request that works, or adjusted with an explicit note (policy: docs/generate.md).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from moe_overlap.skill.generate_resolve import STAGES, GenerateError, Resolved, resolve
from moe_overlap.skill.generate_stages import PURPOSE, stage_checks, stage_config
from moe_overlap.skill.render import FORMATS, RenderError, render

__all__ = ["GenerateError", "GenerateRequest", "GenerateResult", "generate_config", "render", "request_argv",
           "FORMATS", "STAGES", "RenderError", "RECOMMENDED_ENV"]

Stage = Literal["baseline", "overlap", "overlap+wgrad", "flex"]
Format = Literal["bridge-python", "overrides", "megatron-args", "yaml", "json", "moe-overlap"]
# > 1 lets the communication and compute streams run concurrently (rule cuda-device-max-connections)
RECOMMENDED_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


class GenerateRequest(BaseModel):
    """What to generate. Give `ep` and `experts`, or a model `preset` with `gpus` (EP is then derived)."""

    model_config = ConfigDict(extra="forbid")

    ep: int | None = Field(None, ge=1, le=4096, description="expert-parallel size (expert_model_parallel_size); "
                           "or give preset + gpus")
    experts: int | None = Field(None, ge=1, le=4096, description="experts per MoE layer (num_moe_experts)")
    topk: int | None = Field(None, ge=1, le=4096, description="experts per token (moe_router_topk); optional")
    dispatcher: Literal["alltoall", "flex"] = Field(
        "alltoall", description="token dispatcher of every stage; the flex stage switches to flex anyway")
    flex_backend: Literal["deepep", "hybridep"] | None = Field(
        None, description="backend of the flex stage / dispatcher (default: DeepEP where the GPU supports it)")
    gpu: str | None = Field(None, max_length=64,
                            description="GPU name (H100, B200, GB200) or compute capability (9.0)")
    precision: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="training precision; fp32 is adjusted to bf16 (EP overlap needs bf16 or fp16)")
    tp: int = Field(1, ge=1, le=1024, description="tensor-parallel size")
    pp: int = Field(1, ge=1, le=1024, description="pipeline-parallel size (> 1 needs a virtual pipeline)")
    vpp: int | None = Field(None, ge=1, le=1024, description="virtual pipeline size (chosen when pp > 1 and unset)")
    num_layers: int | None = Field(None, ge=1, le=4096,
                                   description="layers; needed with pp > 1 (taken from the preset otherwise)")
    micro_batches: int | None = Field(None, ge=1, le=1_000_000,
                                      description="micro-batches per data-parallel rank (overlap needs >= 2)")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="activation recomputation wish; full is refused (EP overlap forbids it)")
    preset: str | None = Field(None, max_length=64,
                               description="model preset: qwen3-30b-a3b, deepseek-v3, mixtral-8x7b")
    gpus: int | None = Field(None, ge=1, le=1_000_000,
                             description="total GPU count; with no ep, EP = gcd(experts, gpus / (tp x pp))")
    stage: Stage = Field("overlap", description="rollout stage: baseline, overlap, overlap+wgrad or flex")
    plan: bool = Field(False, description="return every stage in order, each with its checks (ignores stage)")
    to: Format = Field("yaml", description="output format of the rendered configs")
    torch_version: str | None = Field(None, max_length=32, description="torch version of the target (>= 2.6.0)")
    te_version: str | None = Field(None, max_length=32, description="Transformer Engine version of the target")
    megatron_core_version: str | None = Field(
        None, max_length=32, description="Megatron-Core release whose rules to validate against (default: installed)")


class Check(BaseModel):
    name: str
    what: str
    command: str


class StageValidation(BaseModel):
    valid: bool
    errors: list[str] = Field(description="rule ids of error findings")
    warnings: list[str] = Field(description="rule ids of warning findings")
    messages: list[str] = Field(description="'rule: message' of every error and warning")
    rule_set: str


class StageResult(BaseModel):
    stage: Stage
    purpose: str
    config: dict[str, Any] = Field(description="nested Megatron-Bridge sections")
    rendered: str = Field(description="the config in the requested format")
    checks: list[Check]
    validation: StageValidation
    notes: list[str]


class Adjustment(BaseModel):
    field: str
    requested: Any
    used: Any
    rule: str | None
    reason: str


class Refusal(BaseModel):
    rule_ids: list[str]
    reasons: list[str] = Field(description="'[rule id] why', one per conflict")
    nearest_request: dict[str, Any] | None = Field(description="the changed request fields that make it work")
    nearest_command: str | None


class GenerateResult(BaseModel):
    ok: bool = Field(description="false: refused, see `refusal`")
    format: str
    stages: list[StageResult]
    adjustments: list[Adjustment]
    notes: list[str]
    refusal: Refusal | None = None
    environment: dict[str, str] = Field(description="environment variables to export for the run")


def request_argv(req: GenerateRequest, *, stage: bool = True) -> list[str]:
    """The `moe-overlap generate` arguments that reproduce `req` (without --to / --format)."""
    argv: list[str] = []
    defaults = GenerateRequest()
    for name, flag in (("preset", "--preset"), ("gpus", "--gpus"), ("ep", "--ep"), ("experts", "--experts"),
                       ("topk", "--topk"), ("dispatcher", "--dispatcher"), ("flex_backend", "--flex-backend"),
                       ("gpu", "--gpu"), ("precision", "--precision"), ("tp", "--tp"), ("pp", "--pp"),
                       ("vpp", "--vpp"), ("num_layers", "--num-layers"), ("micro_batches", "--micro-batches"),
                       ("recompute", "--recompute"), ("torch_version", "--torch-version"),
                       ("te_version", "--te-version"), ("megatron_core_version", "--megatron-core-version")):
        value = getattr(req, name)
        if value is not None and value != getattr(defaults, name):
            argv += [flag, str(value)]
    if stage:
        argv += ["--plan"] if req.plan else ["--stage", req.stage]
    return argv


def _command(req: GenerateRequest) -> str:
    return "moe-overlap generate " + " ".join(request_argv(req))


def _refusal(req: GenerateRequest, res: Resolved) -> Refusal:
    changes: dict[str, Any] = {}
    for r in res.refusals:
        changes.update(r.nearest)
    nearest = req.model_copy(update=changes)
    # The nearest request must itself be satisfiable; a second conflict may appear once the first is fixed.
    for _ in range(4):
        try:
            extra = resolve(nearest).refusals
        except GenerateError:
            nearest = None
            break
        if not extra:
            break
        for r in extra:
            changes.update(r.nearest)
        nearest = req.model_copy(update=changes)
    else:
        nearest = None
    changed = {k: v for k, v in changes.items() if getattr(req, k) != v}
    return Refusal(rule_ids=list(dict.fromkeys(r.rule for r in res.refusals)),
                   reasons=[f"[{r.rule}] {r.reason}" for r in res.refusals],
                   nearest_request=changed if nearest is not None else None,
                   nearest_command=_command(nearest) if nearest is not None else None)


def _validate(config: dict[str, Any], req: GenerateRequest) -> StageValidation:
    from moe_overlap.skill.validate import validate_config

    result = validate_config(config, torch_version=req.torch_version, te_version=req.te_version, gpu=req.gpu,
                             megatron_core_version=req.megatron_core_version, env=RECOMMENDED_ENV, detect=False)
    return StageValidation(valid=result.valid, errors=[f.rule for f in result.findings if f.severity == "error"],
                           warnings=[f.rule for f in result.findings if f.severity == "warning"],
                           messages=[f"{f.rule}: {f.message}" for f in result.findings if f.severity != "info"],
                           rule_set=result.rule_set.name)


def generate_config(request: GenerateRequest | dict[str, Any]) -> GenerateResult:
    """Generate the requested stage (or the whole plan) in `request.to`. Raises GenerateError on a malformed
    request; an unsatisfiable one comes back with ok=false and a `refusal`."""
    req = request if isinstance(request, GenerateRequest) else GenerateRequest.model_validate(request)
    res = resolve(req)
    adjustments = [Adjustment(**vars(a)) for a in res.adjustments]
    if res.refusals:
        return GenerateResult(ok=False, format=req.to, stages=[], adjustments=adjustments, notes=res.notes,
                              refusal=_refusal(req, res), environment=RECOMMENDED_ENV)
    stages: list[StageResult] = []
    for name in res.stages:
        config, notes = stage_config(res, name, req.gpu)
        stage_req = req.model_copy(update={"plan": False, "stage": name})
        try:
            rendered = render(config, req.to, micro_batches=req.micro_batches)
        except RenderError as exc:
            raise GenerateError(str(exc), field="to", fix="use --to yaml, json or overrides") from None
        stages.append(StageResult(stage=name, purpose=PURPOSE[name], config=config, rendered=rendered,
                                  checks=[Check(**c) for c in stage_checks(req, name, _command(stage_req), res.ep)],
                                  validation=_validate(config, req), notes=notes))
    errors = {rule: s.stage for s in stages for rule in s.validation.errors}
    if errors:
        # A conflict the request checks did not foresee: refuse rather than hand out an invalid config.
        return GenerateResult(ok=False, format=req.to, stages=stages, adjustments=adjustments, notes=res.notes,
                              refusal=Refusal(rule_ids=sorted(errors), reasons=[
                                  f"[{rule}] the generated {stage} config fails this rule" for rule, stage in errors.items()],
                                  nearest_request=None, nearest_command=None), environment=RECOMMENDED_ENV)
    return GenerateResult(ok=True, format=req.to, stages=stages, adjustments=adjustments, notes=res.notes,
                          environment=RECOMMENDED_ENV)
