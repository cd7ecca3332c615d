"""Input models of the MCP tools: every argument described, every closed set an enum, examples in the schema.

`generate_config` and `estimate_overlap_benefit` take the `skill/` request models with their enum-like
fields narrowed to the tables the tools check against (choices.py). Every field has a description: it is
what the model reads in the tool's input schema, and what `toolkit` quotes in a "Fix:" when the value
is wrong. Torch-free.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from moe_overlap.mcp import choices
from moe_overlap.mcp.safety import (
    MAX_CONFIG_CHARS,
    MAX_LOG_CHARS,
    MAX_OVERRIDES,
    MAX_PATH_CHARS,
    MAX_TEXT_CHARS,
)
from moe_overlap.skill.estimate.model import EstimateRequest
from moe_overlap.skill.generate.model import GenerateRequest

SKILL = choices.SKILL
Mode = Literal["baseline", "overlap", "overlap+wgrad"]
ConfigKind = Literal["object", "path", "text"]
_PATH = re.compile(r"^[^\n{]*\.(ya?ml|json)$", re.IGNORECASE)
_TEXT = re.compile(r"\n|^\s*[{\[]")
# One argument, three forms; the two string forms cannot both match (a path has no newline and no '{').
CONFIG_SCHEMA = {
    "oneOf": [
        {"type": "object"},
        {"type": "string", "pattern": _PATH.pattern, "maxLength": MAX_PATH_CHARS},
        {"type": "string", "pattern": _TEXT.pattern, "maxLength": MAX_CONFIG_CHARS},
    ],
    "examples": ["configs/train.yaml"],
}
CONFIG_FORMS = "object (sections model, comm_overlap, ddp), .yaml/.json path in an allowed folder, or text"


def config_kind(value: Any) -> ConfigKind:
    """Which form of the `config` argument `value` is (its schema's oneOf arm)."""
    if isinstance(value, dict):
        return "object"
    return "text" if _TEXT.search(value) else "path"


def _check_config(value: Any) -> Any:
    if value is None or isinstance(value, dict):
        return value
    kind = config_kind(value)
    if kind == "text" and len(value) > MAX_CONFIG_CHARS:
        raise ValueError(f"config text is {len(value)} characters; the limit is {MAX_CONFIG_CHARS}")
    if kind == "path" and (len(value) > MAX_PATH_CHARS or not _PATH.match(value)):
        raise ValueError("a one-line string must be the path of a .yaml, .yml or .json file; pass YAML text "
                         "on several lines, or the config as a JSON object")
    return value


ConfigArg = Annotated[dict[str, Any] | str | None, AfterValidator(_check_config), WithJsonSchema(CONFIG_SCHEMA)]


def _gpu(value: Any) -> Any:
    """A known GPU name (any case) or a compute capability; anything else is refused with the choices."""
    if not isinstance(value, str):
        return value
    known = {n.upper(): n for n in choices.gpu_names()}
    if value.strip().upper() in known:
        return known[value.strip().upper()]
    if re.match(choices.CAPABILITY_PATTERN, value.strip()):
        return value.strip()
    raise ValueError(f"unknown GPU {value!r}; give one of {', '.join(choices.gpu_names())} or a compute "
                     "capability such as 9.0")


def _gpu_arg(description: str) -> Any:
    return Annotated[str | None, AfterValidator(_gpu), WithJsonSchema(choices.gpu_schema(description))]


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _fabric(value: Any) -> Any:
    """Either order, any case: 'IB-400G+h100-nvlink' is 'h100-nvlink+ib-400g'."""
    if not isinstance(value, str):
        return value
    parts = [p.strip().lower() for p in value.split("+") if p.strip()]
    return "+".join(sorted(parts, key=lambda p: (not p.endswith("nvlink"), p)))


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ConfigSource(_Input):
    """The config in one argument (`config`); the older split spellings are still read, not advertised."""

    config_text: SkipJsonSchema[str | None] = Field(None, max_length=MAX_CONFIG_CHARS)
    config_path: SkipJsonSchema[str | None] = Field(None, max_length=MAX_PATH_CHARS)

    def source(self) -> tuple[ConfigKind, Any] | None:
        """(form, value) of the config given, or None."""
        value = getattr(self, "config", None)
        if value is not None:
            return config_kind(value), value
        if self.config_text is not None:
            return "text", self.config_text
        if self.config_path is not None:
            return "path", self.config_path
        return None

    def _count_sources(self) -> int:
        return sum(x is not None for x in (getattr(self, "config", None), self.config_text, self.config_path))


class ListSkillsInput(_Input):
    pass


class GetSkillCardInput(_Input):
    name: Literal[choices.skill_names()] = Field(  # type: ignore[valid-type]
        SKILL, description="the skill, as list_skills names it")
    section: Literal[choices.card_sections()] | None = Field(  # type: ignore[valid-type]
        None, description="one section; without section and field: the contents")
    field: str | None = Field(
        None, max_length=256, examples=["constraints.ep-size-gt-1"],
        description="a dotted path (inside `section` when given); list entries by id, name or index")


class ValidateConfigInput(_ConfigSource):
    config: ConfigArg = Field(None, description=CONFIG_FORMS)
    argv: str | list[str] | None = Field(
        None, max_length=MAX_CONFIG_CHARS,
        description="Megatron-LM flags, e.g. --expert-model-parallel-size 8 (alone or on top of `config`)")
    overrides: list[str] = Field(
        default_factory=list, max_length=MAX_OVERRIDES,
        description="key=value overrides on top, e.g. model.expert_model_parallel_size=8")
    torch_version: str | None = Field(None, max_length=32, description="target torch version, e.g. 2.6.0")
    te_version: str | None = Field(None, max_length=32, description="target Transformer Engine version")
    megatron_core_version: str | None = Field(None, max_length=32, description="target Megatron-Core version (rules for 0.16-0.19)")
    gpu: _gpu_arg("GPU name or compute capability") = None  # type: ignore[valid-type]
    env: dict[str, str] | None = Field(None, description="the target job's environment variables")

    @model_validator(mode="after")
    def _one_source(self) -> ValidateConfigInput:
        if self._count_sources() > 1 or (self._count_sources() == 0 and self.argv is None):
            raise ValueError("give the config in `config` (an object, a file path or YAML/JSON text), "
                             "Megatron-LM flags in `argv`, or both")
        return self


def _schema_text(descriptions: dict[str, str], examples: list[dict[str, Any]]) -> Any:
    """Published descriptions for a `skill/` request model (short: every tools/list carries them) and examples.

    Only the schema changes; the fields, their bounds and their validation stay the model's own.
    """
    def apply(schema: dict[str, Any], cls: type) -> None:
        for name, text in descriptions.items():
            schema["properties"][name]["description"] = text
        if examples:
            schema["examples"] = examples
    return apply


class GenerateInput(GenerateRequest):
    """generate_config's request with the model preset and the GPU as closed sets."""

    model: Annotated[Literal[choices.model_presets()] | None, BeforeValidator(_lower)] = Field(  # type: ignore[valid-type]
        None, validation_alias=AliasChoices("model", "preset"))
    gpu: _gpu_arg("GPU name or compute capability") = None  # type: ignore[valid-type]
    model_config = ConfigDict(extra="forbid", json_schema_extra=_schema_text({
        "ep": "EP size; or give model + gpus", "experts": "experts per MoE layer",
        "topk": "experts per token", "dispatcher": "token dispatcher (the flex stage uses flex)",
        "flex_backend": "flex backend (default: by GPU)", "precision": "fp32 becomes bf16 (overlap needs bf16/fp16)",
        "tp": "tensor-parallel size", "pp": "pipeline-parallel size", "vpp": "virtual pipeline size",
        "num_layers": "layers (pp > 1 without a model)",
        "micro_batches": "micro-batches per DP rank (overlap needs >= 2)", "recompute": "activation recompute "
        "(full is refused)", "model": "model preset (alias preset)", "gpus": "total GPUs (EP derived "
        "when ep is not given)", "stage": "rollout stage", "plan": "every stage in order, with its "
        "checks", "to": "config format", "torch_version": "target torch version", "te_version": "target "
        "Transformer Engine version", "megatron_core_version": "Megatron-Core rule set (default: installed)",
    }, []))


MIN_SHARE = 1e-6  # the smallest efficiency an estimate takes: times stay finite


class EstimateInput(EstimateRequest):
    """estimate_overlap_benefit's request with the fabric and GPU presets as closed sets."""

    model: Annotated[Literal[choices.estimate_models()] | None, BeforeValidator(_lower)] = None  # type: ignore[valid-type]
    fabric: Annotated[Literal[choices.fabrics()] | None, BeforeValidator(_fabric)] = None  # type: ignore[valid-type]
    gpu_preset: Annotated[Literal[choices.gpu_presets()] | None, BeforeValidator(_lower)] = None  # type: ignore[valid-type]
    calibration: Annotated[Any, WithJsonSchema({"type": "object"})] = None
    # The request model's validator turns a number or an object into the shares; the published schema stays short.
    hbm_efficiency: Annotated[Any, WithJsonSchema({"anyOf": [{"type": "number"}, {"type": "object"}]})] = None
    # Accepted, not published: the chunked schedule is no longer predicted (its timeline serves the CPU benchmark),
    # the op-count host estimate is on unless a benchmark of our own layer turns it off, and overhead_ms is its
    # fixed-cost residual.
    chunks: SkipJsonSchema[int] = 4
    chunk_backward: SkipJsonSchema[bool] = True
    megatron_host: SkipJsonSchema[bool] = True
    overhead_ms: SkipJsonSchema[float | None] = None  # a calibration residual of our own benchmarks
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra=_schema_text({
        "model": "preset", "hidden": "D (or model)", "moe_ffn": "F (or model)",
        "experts": "E (or model)", "topk": "K (or model)", "tokens": "per micro-batch", "seq_length": "attn seq",
        "micro_batches": "per DP rank",
        "gpus_per_node": "NVLink domain",
        "fabric": "intra[+inter]",
        "intra_gbps": "intra GB/s", "inter_gbps": "inter GB/s", "a2a_efficiency": "of link GB/s",
        "gpu_preset": "GPU", "mem_gbps": "memory-bound GB/s",
        "hbm_efficiency": "HBM share(s)",
        "hbm_gbps": "HBM peak GB/s", "attn_ms": "attn fwd ms",
        "host_ms": "host ms per layer",
        "other_ms": "outside layers", "overlap_efficiency": "0..1", "calibration": "measured",
        "global_batch": "GBS", "micro_batch_size": "MBS", "dp": "DP", "dispatcher": "backend",
        "cuda_device_max_connections": "1: serial", "cuda_graph_scope": "graphed parts", "a2a_engine": "byte mover", "sm_margin": "SMs left, 0-32", "recompute": "full: exposed",
        "pp": "PP", "vpp": "VPP", "ep_stride": "TP x CP", "baseline_step_ms": "plain step ms", "layers": "MoE layers",
        "precision": "dtype", "tflops": "GEMM TFLOP/s", "dense_tflops": "dense TFLOP/s", "ep": "EP",
    }, [{"model": "qwen3-30b-a3b", "ep": 8, "gpu_preset": "h100", "global_batch": 1024, "dp": 16}]))

    @field_validator("a2a_efficiency", "hbm_efficiency", mode="before")
    @classmethod
    def _realistic_share(cls, v: Any, info: Any) -> Any:
        """A share under MIN_SHARE (1e-320 passes `> 0`) makes every time overflow: refused here, naming the field
        (the request model admits it; skill/estimate/api.py _recommend then found no finite schedule)."""
        shares = v.values() if isinstance(v, dict) else [v]
        if any(isinstance(x, int | float) and not isinstance(x, bool) and 0 < x < MIN_SHARE for x in shares):
            raise ValueError(f"{info.field_name} is a share of the peak: give one >= {MIN_SHARE:g} (e.g. 0.7); "
                             "a smaller one makes every predicted time overflow")
        return v

    @field_validator("calibration", mode="after")
    @classmethod
    def _calibration(cls, v: Any) -> Any:
        from moe_overlap.skill.estimate.model import Calibration

        return v if v is None or isinstance(v, Calibration) else Calibration.model_validate(v)


class SlurmJob(_Input):
    """run_verification's `slurm` argument (launcher slurm): the options of `verify --launcher slurm`."""

    nodes: int | None = Field(None, ge=1, le=4096, description="nodes; default nproc / gpus_per_node")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="ranks per node")
    partition: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="partition")
    account: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$", description="account")
    time: str | None = Field(None, pattern=r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$", description="time limit, e.g. 00:30:00")


class RunVerificationInput(_ConfigSource):
    config: ConfigArg = Field(None, description=f"{CONFIG_FORMS}; default: a small built-in one")
    nproc: int | None = Field(None, ge=1, le=8, description="ranks; default: the config's EP size")
    device: Literal["cpu", "cuda"] = Field("cpu", description="cpu (gloo) or cuda (NCCL)")
    steps: int | None = Field(None, ge=2, le=500, description="optimizer steps per mode")
    micro_batches: int | None = Field(None, ge=1, le=64, description="per step")
    modes: list[Mode] | None = Field(None, min_length=1, max_length=3, description="default: all")
    schedule: Literal["chunked", "1f1b"] | None = Field(None, description="overlap schedule")
    fabric: Literal["native", "emulated-net"] = Field("native", description="cuda: emulated-net = as over "
                                                                            "a network")
    a2a: Literal["nccl", "ce", "auto"] | None = Field(None, description="cuda: all-to-all transport")
    timeout_s: float = Field(600.0, ge=5, le=3600, description="wall-clock limit, s")
    launcher: Literal["local", "slurm"] = Field("local", description="slurm: an sbatch job")
    # The nested model validates; the published schema stays one line (tools/list has a character budget).
    slurm: Annotated[SlurmJob | None, WithJsonSchema({
        "type": "object", "description": "{nodes, gpus_per_node, partition, account, time}"})] = None
    background: bool = Field(False, description="return a job_id at once")

    @model_validator(mode="after")
    def _at_most_one_source(self) -> RunVerificationInput:
        if self._count_sources() > 1:
            raise ValueError("give the config once, in `config`")
        if self.slurm is not None and self.launcher != "slurm":
            raise ValueError("`slurm` is for launcher='slurm': give both, or neither")
        return self


class JobInput(_Input):
    job_id: str = Field(max_length=64, description="what run_verification returned")


class StatusInput(JobInput):
    wait_s: float = Field(0.0, ge=0, le=50, description="seconds to wait for the job to end before answering")


class CancelInput(JobInput):
    wait_s: float = Field(30.0, ge=0, le=120, description="seconds to wait for the run and its processes to end")


class CheckLogInput(_Input):
    text: str | None = Field(None, max_length=MAX_LOG_CHARS, description="the training log text (or an excerpt)")
    path: str | None = Field(None, max_length=MAX_PATH_CHARS,
                             description="path of a log file inside an allowed folder (large files: the tail is read)")

    @model_validator(mode="after")
    def _one_source(self) -> CheckLogInput:
        if (self.text is None) == (self.path is None):
            raise ValueError("give exactly one of `text` (the log content) or `path` (a file under an allowed folder)")
        return self


class DiagnoseInput(_Input):
    text: str = Field(min_length=1, max_length=MAX_TEXT_CHARS,
                      description="the error message, traceback excerpt or symptom in words")
    limit: int = Field(5, ge=1, le=20, description="how many ranked failure modes to return (1-20)")
