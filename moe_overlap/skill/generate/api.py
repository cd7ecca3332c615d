"""generate_config: minimal working EP-overlap configurations and a staged rollout plan (torch-free).

The seed's advice is the spine: start correctness-first with plain overlap (delayed wgrad off), then add
delayed wgrad, then the flex dispatcher. Every generated stage is validated with `validate_config` in the
request's environment before it is returned; requests that cannot be satisfied are refused with the rule
ids and the nearest request that works, or adjusted with an explicit note (policy: docs/generate.md).
"""

from __future__ import annotations

from typing import Any

from moe_overlap.skill.config.model import effective_values, parse_config
from moe_overlap.skill.generate.model import (
    RECOMMENDED_ENV,
    Adjustment,
    Check,
    GenerateRequest,
    GenerateResult,
    Refusal,
    StageResult,
    StageValidation,
)
from moe_overlap.skill.generate.render import RenderError, render
from moe_overlap.skill.generate.resolve import GenerateError, Resolved, resolve
from moe_overlap.skill.generate.stages import PURPOSE, stage_checks, stage_config
from moe_overlap.skill.rules.base import Ctx
from moe_overlap.skill.rules.notes import ResultNote, notes_for
from moe_overlap.skill.rules.validate import ValidationResult, validate_config
from moe_overlap.skill.rules.versions import select_core


def request_argv(req: GenerateRequest, *, stage: bool = True) -> list[str]:
    """The `moe-overlap generate` arguments that reproduce `req` (without --to / --format)."""
    argv: list[str] = []
    defaults = GenerateRequest()
    for name, flag in (("model", "--model"), ("gpus", "--gpus"), ("ep", "--ep"), ("experts", "--experts"),
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


def _validate(config: dict[str, Any], req: GenerateRequest) -> ValidationResult:
    return validate_config(config, torch_version=req.torch_version, te_version=req.te_version, gpu=req.gpu,
                           megatron_core_version=req.megatron_core_version, env=RECOMMENDED_ENV, detect=False)


def _next(config: dict[str, Any], result: ValidationResult, req: GenerateRequest, dp: int) -> list[ResultNote]:
    """The notes of this stage's config; the DP size, which the config does not carry, comes from the layout."""
    values, paths = effective_values(parse_config(config))
    ctx = Ctx(values=values, paths=paths, env=result.environment, core=select_core(req.megatron_core_version).line)
    return notes_for(ctx, dp=dp)


def _summary(result: ValidationResult) -> StageValidation:
    return StageValidation(valid=result.valid, errors=[f.rule for f in result.findings if f.severity == "error"],
                           warnings=[f.rule for f in result.findings if f.severity == "warning"],
                           messages=[f"{f.rule}: {f.message}" for f in result.findings if f.severity != "info"],
                           rule_set=result.rule_set.name)


def generate_config(request: GenerateRequest | dict[str, Any]) -> GenerateResult:
    """Generate the requested stage (or the whole plan) in `request.to`. Raises GenerateError on a malformed
    request; an unsatisfiable one comes back with ok=false and a `refusal`."""
    req = request if isinstance(request, GenerateRequest) else GenerateRequest.model_validate(request)
    res = resolve(req)
    if req.to == "moe-overlap":  # the one format with no place for it
        res.notes.append("the moe-overlap format carries no environment: export CUDA_DEVICE_MAX_CONNECTIONS=32 "
                         "before `moe-overlap verify --device cuda` (cuda-device-max-connections)")
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
        validation = _validate(config, req)
        stages.append(StageResult(stage=name, purpose=PURPOSE[name], config=config, rendered=rendered,
                                  checks=[Check(**c) for c in stage_checks(req, name, _command(stage_req), res.ep)],
                                  validation=_summary(validation), notes=notes,
                                  next=_next(config, validation, req, res.dp)))
    errors = {rule: s.stage for s in stages for rule in s.validation.errors}
    if errors:
        # A conflict the request checks did not foresee: refuse rather than hand out an invalid config.
        return GenerateResult(ok=False, format=req.to, stages=stages, adjustments=adjustments, notes=res.notes,
                              refusal=Refusal(rule_ids=sorted(errors), reasons=[
                                  f"[{rule}] the generated {stage} config fails this rule" for rule, stage in errors.items()],
                                  nearest_request=None, nearest_command=None), environment=RECOMMENDED_ENV)
    return GenerateResult(ok=True, format=req.to, stages=stages, adjustments=adjustments, notes=res.notes,
                          environment=RECOMMENDED_ENV)
