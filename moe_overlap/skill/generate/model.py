"""The request and result models of generate_config (pydantic): what a caller asks for and what comes back.

Kept apart from api.py so the resolver and the stage builder can read the request without importing the
module that imports them. ``schemas/generate-result.schema.json`` is generated from `GenerateResult`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from moe_overlap.skill.rules.notes import ResultNote

Stage = Literal["baseline", "overlap", "overlap+wgrad", "flex"]
Format = Literal["bridge-python", "overrides", "megatron-args", "yaml", "json", "moe-overlap"]
# > 1 lets the communication and compute streams run concurrently (rule cuda-device-max-connections)
RECOMMENDED_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}


class GenerateRequest(BaseModel):
    """What to generate. Give `ep` and `experts`, or a `model` with `gpus` (EP is then derived)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    ep: int | None = Field(None, ge=1, le=4096, description="expert-parallel size (expert_model_parallel_size); "
                           "or give model + gpus")
    experts: int | None = Field(None, ge=1, le=4096, description="experts per MoE layer (num_moe_experts)")
    topk: int | None = Field(None, ge=1, le=4096, description="experts per token (moe_router_topk); optional")
    dispatcher: Literal["alltoall", "flex"] | None = Field(
        None, description="token dispatcher of every stage (default: what Megatron-Bridge's recipe for this model "
        "and GPU uses, else alltoall); the flex stage switches to flex anyway")
    flex_backend: Literal["deepep", "hybridep"] | None = Field(
        None, description="backend of the flex stage / dispatcher (default: DeepEP where the GPU supports it)")
    gpu: str | None = Field(None, max_length=64,
                            description="GPU name (H100, B200, GB200) or compute capability (9.0)")
    precision: Literal["bf16", "fp16", "fp32"] = Field(
        "bf16", description="training precision; fp32 is adjusted to bf16 (EP overlap needs bf16 or fp16)")
    tp: int | None = Field(None, ge=1, le=1024,
                           description="tensor-parallel size (default: the Bridge recipe's at this PP, else 1)")
    pp: int = Field(1, ge=1, le=1024, description="pipeline-parallel size (> 1 needs a virtual pipeline)")
    vpp: int | None = Field(None, ge=1, le=1024, description="virtual pipeline size (chosen when pp > 1 and unset)")
    num_layers: int | None = Field(None, ge=1, le=4096,
                                   description="layers; needed with pp > 1 (taken from the model otherwise)")
    micro_batches: int | None = Field(None, ge=1, le=1_000_000,
                                      description="micro-batches per data-parallel rank (overlap needs >= 2; "
                                      "default: the Bridge recipe's, else 8, or 4 x pp)")
    recompute: Literal["none", "selective", "full"] = Field(
        "none", description="activation recomputation wish; full is refused (EP overlap forbids it)")
    model: str | None = Field(None, max_length=64, validation_alias=AliasChoices("model", "preset"),
                              description="model preset (alias: preset): qwen3-30b-a3b, qwen3-235b-a22b, "
                              "qwen3-next-80b-a3b, deepseek-v3, mixtral-8x7b")
    gpus: int | None = Field(None, ge=1, le=1_000_000,
                             description="total GPU count; with no ep, EP = the Bridge recipe's at this GPU count "
                             "and PP, else gcd(experts, gpus / pp)")
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
    next: list[ResultNote] = Field(default_factory=list, description="the notes that apply to this stage's config: "
                             "memory, micro-batches, CUDA_DEVICE_MAX_CONNECTIONS, eval steps, delayed wgrad, "
                             "what to verify next")


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
