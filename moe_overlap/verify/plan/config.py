"""VerifyConfig: the run configuration of a verification ("moe-overlap" format), and the one pass from
a config source onto it (torch-free): read once; ours is validated as a VerifyConfig, a Megatron-Bridge-style
or flat Megatron config is parsed once into the skill's OverlapConfig and mapped once onto a VerifyConfig.
The parsed OverlapConfig travels on (LoadedConfig.parsed) to the validation of criterion 1, never re-read.

Field names are Megatron's where one exists. A Megatron config describes a production model
(e.g. hidden 2048, 128 experts on 16 GPUs); the included implementation verifies the *overlap
machinery* for that config's structural choices (EP size, experts, top-k, dispatcher, precision,
overlap flags) on a small model. What cannot be mapped is listed in ``notes``, never dropped silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from moe_overlap.skill.config.load import ConfigError, check_values, read_file
from moe_overlap.skill.config.model import OverlapConfig, effective_values, looks_like_config, parse_config
from moe_overlap.verify.run.corpus import VOCAB_SIZE

FORMAT = "moe-overlap"


class VerifyConfigError(ValueError):
    """Bad verification config: names the field and the fix (exit 2, never a traceback)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.message, self.field, self.fix = message, field, fix


class VerifyConfig(BaseModel):
    """One verification run (every mode shares it; the modes differ only in schedule and wgrad)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal["moe-overlap"] = FORMAT
    # model (the embedded small MoE LM; byte-level tokens)
    hidden_size: int = Field(64, ge=8, le=4096)
    moe_ffn_hidden_size: int = Field(64, ge=4, le=16384)
    num_moe_experts: int = Field(4, ge=1, le=1024)
    moe_router_topk: int = Field(2, ge=1, le=1024)
    num_layers: int = Field(2, ge=1, le=64)
    num_attention_heads: int = Field(4, ge=1, le=4096)
    vocab_size: int = Field(VOCAB_SIZE, ge=VOCAB_SIZE, le=VOCAB_SIZE, description="byte-level tokens")
    seq_length: int = Field(64, ge=2, le=8192)
    # parallelism / numerics
    expert_model_parallel_size: int = Field(2, ge=1, le=1024)
    moe_token_dispatcher_type: Literal["alltoall"] = "alltoall"
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    # the overlap under test
    overlap_moe_expert_parallel_comm: bool = True
    delay_wgrad_compute: bool = True
    schedule: Literal["none", "chunked", "1f1b"] = "1f1b"
    chunks: int = Field(2, ge=1, le=64, description="token chunks of the chunked schedule")
    # training
    micro_batches: int = Field(4, ge=1, le=256)
    micro_batch_size: int = Field(2, ge=1, le=1024)
    steps: int = Field(16, ge=2, le=100000, description="optimizer steps per mode (the first is warm-up)")
    lr: float = Field(3e-3, gt=0, le=1.0)
    seed: int = Field(1234, ge=0, le=2**63 - 1)

    @model_validator(mode="after")
    def _consistent(self) -> VerifyConfig:
        if self.moe_router_topk > self.num_moe_experts:
            raise ValueError(f"moe_router_topk={self.moe_router_topk} exceeds num_moe_experts={self.num_moe_experts}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by "
                             f"num_attention_heads={self.num_attention_heads}")
        if self.num_moe_experts % self.expert_model_parallel_size:
            raise ValueError(f"num_moe_experts={self.num_moe_experts} is not divisible by "
                             f"expert_model_parallel_size={self.expert_model_parallel_size}")
        return self

    def megatron_view(self) -> dict[str, Any]:
        """The overlap-relevant part as a Megatron-Bridge-style config (what the validator reads)."""
        return {
            "model": {
                "expert_model_parallel_size": self.expert_model_parallel_size,
                "num_moe_experts": self.num_moe_experts,
                "moe_router_topk": self.moe_router_topk,
                "moe_token_dispatcher_type": self.moe_token_dispatcher_type,
                "bf16": self.precision == "bf16",
                "fp16": self.precision == "fp16",
            },
            "comm_overlap": {
                "overlap_moe_expert_parallel_comm": self.overlap_moe_expert_parallel_comm,
                "delay_wgrad_compute": self.delay_wgrad_compute,
            },
            "train": {"micro_batch_size": self.micro_batch_size,
                      "global_batch_size": self.micro_batch_size * self.micro_batches
                      * self.expert_model_parallel_size},
        }


# Megatron fields read structurally; everything else in a Megatron config is reported as not mapped.
_KEPT_SMALL = ("hidden_size", "moe_ffn_hidden_size", "ffn_hidden_size", "num_layers", "num_attention_heads",
               "seq_length", "vocab_size", "micro_batch_size", "global_batch_size", "train_iters")
_NOT_MODELLED = {
    "tensor_model_parallel_size": 1, "pipeline_model_parallel_size": 1, "context_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None, "recompute_granularity": None, "recompute_method": None,
    "recompute_modules": None, "moe_shared_expert_intermediate_size": None, "moe_shared_expert_overlap": False,
    "mtp_num_layers": None, "cuda_graph_impl": None, "cuda_graph_scope": None, "sequence_parallel": False,
    "overlap_grad_reduce": False, "gradient_accumulation_fusion": False,
}


def _flat_values(parsed: OverlapConfig) -> dict[str, Any]:
    """The parsed config as one flat dict: section fields (extras too), then the values the validator's rules
    read after Bridge's precedence (`comm_overlap` overrides the model's and ddp's)."""
    flat: dict[str, Any] = {}
    dumped = parsed.model_dump(mode="json")
    for section in ("model", "train", "ddp", "mixed_precision", "dataset"):
        if isinstance(dumped.get(section), dict):
            flat.update(dumped[section])
    if isinstance(dumped.get("comm_overlap"), dict):
        flat.update({k: v for k, v in dumped["comm_overlap"].items() if v is not None})
    values, _paths = effective_values(parsed)
    flat.update(values)
    return flat


def _typed(key: str, value: Any, kind: type) -> Any:
    """`value` as `kind` by pydantic's rules ("8" -> 8, "true" -> True; "abc", [1], 2.5 -> a clear error)."""
    try:
        return TypeAdapter(kind).validate_python(value)
    except ValidationError as exc:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise VerifyConfigError(f"invalid config: {key}: {exc.errors()[0]['msg'].lower()}, got {shown}", field=key,
                                fix=f"give {key} as {'an integer' if kind is int else 'true or false'}") from None


def map_megatron(parsed: OverlapConfig) -> tuple[VerifyConfig, list[str]]:
    """Map a parsed Megatron-Bridge-style (or flat Megatron) config onto a VerifyConfig + notes."""
    flat = _flat_values(parsed)
    notes: list[str] = []
    values: dict[str, Any] = {}
    for key in ("expert_model_parallel_size", "num_moe_experts", "moe_router_topk"):
        if flat.get(key) is not None:
            values[key] = _typed(key, flat[key], int)
    for key in ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
        if flat.get(key) is not None:
            values[key] = _typed(key, flat[key], bool)
    values["precision"] = "bf16" if flat.get("bf16") else "fp16" if flat.get("fp16") else "fp32"
    if values["precision"] == "fp32":
        notes.append("precision: neither bf16 nor fp16 is set, the run uses fp32")
    dispatcher = flat.get("moe_token_dispatcher_type") or "alltoall"
    if dispatcher != "alltoall":
        notes.append(f"moe_token_dispatcher_type={dispatcher!r}: the included implementation has only the all-to-all "
                     "dispatcher; the run uses it (the validator still checks the dispatcher rules as given)")
    if flat.get("moe_flex_dispatcher_backend"):
        notes.append(f"moe_flex_dispatcher_backend={flat['moe_flex_dispatcher_backend']!r}: DeepEP/HybridEP kernels are "
                     "not part of this package; not mapped")
    if values.get("delay_wgrad_compute") and not values.get("overlap_moe_expert_parallel_comm", True):
        notes.append("delay_wgrad_compute without overlap_moe_expert_parallel_comm is invalid upstream; the "
                     "overlap+wgrad mode still runs with the overlap on")
    if not values.get("overlap_moe_expert_parallel_comm", False):
        notes.append("overlap_moe_expert_parallel_comm is off in this config: the overlap modes verify what "
                     "turning it on would do (validated with it on)")
    kept = [f"{k}={flat[k]}" for k in _KEPT_SMALL if flat.get(k) is not None]
    if kept:
        notes.append("model size kept at the small verification model (the run checks the overlap machinery, "
                     "not the production model): not mapped " + ", ".join(kept))
    for key, neutral in _NOT_MODELLED.items():
        if key in flat and flat[key] not in (neutral, None, False, 0, [], "", "none"):
            notes.append(f"{key}={flat[key]!r} is not modelled by the included implementation (checked by the "
                         "validator only)")
    experts = values.get("num_moe_experts", 4)
    values.setdefault("num_moe_experts", experts)
    values["moe_router_topk"] = min(values.get("moe_router_topk", 2), experts)
    values.setdefault("expert_model_parallel_size", 1 if experts < 2 else 2)
    try:
        return VerifyConfig(**values), notes
    except ValidationError as exc:
        raise _as_error(exc) from None


def _as_error(exc: ValidationError) -> VerifyConfigError:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err.get("loc", ())) or None
    return VerifyConfigError(f"invalid config: {field + ': ' if field else ''}{err['msg']}", field=field,
                             fix="see `moe-overlap verify --help` and docs for the moe-overlap config format")


def read_source(source: str | Path | dict[str, Any]) -> dict[str, Any]:
    """A YAML/JSON file or a dict; clear errors for unreadable input (the validator's reader: line and
    column of syntax errors, duplicate keys, size limit, binary input)."""
    try:
        if isinstance(source, dict):
            return check_values(source)  # JSON types only, bounded (an MCP client's object)
        path = Path(source)
        if not path.exists() and not path.is_symlink():
            raise VerifyConfigError(f"config file not found: {path}", field="CONFIG",
                                    fix="give an existing YAML/JSON file")
        return read_file(path, recognised=_recognised)
    except ConfigError as exc:  # its message already names the file
        raise VerifyConfigError(exc.message, field=exc.field or "CONFIG", fix=exc.fix) from None


def _recognised(data: dict[str, Any]) -> bool:
    """A file without a config suffix is read only when it names our fields or a Megatron section / field."""
    return data.get("format") == FORMAT or bool(set(data) & set(VerifyConfig.model_fields)) or looks_like_config(data)


@dataclass(frozen=True)
class LoadedConfig:
    """A config source after the one pass: the run config, what the mapping could not carry over, the
    source's kind, and (a Megatron source only) its parse in the skill's model, for the validator."""

    cfg: VerifyConfig
    notes: list[str]
    kind: Literal["default", "moe-overlap", "megatron"]
    parsed: OverlapConfig | None = None


def parse_megatron(data: dict[str, Any]) -> OverlapConfig:
    """A Megatron-Bridge-style or flat Megatron config, parsed by the validator's parser."""
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise VerifyConfigError(f"invalid config: {exc}", field=exc.field, fix=exc.fix) from None


def load_verify_config(source: str | Path | dict[str, Any] | None) -> LoadedConfig:
    """Read `source` once and map it once (see the module docstring)."""
    if source is None:
        return LoadedConfig(VerifyConfig(), [], "default")
    data = read_source(source)
    # Ours: marked with `format: moe-overlap`, or a flat mapping of VerifyConfig fields only.
    if data.get("format") == FORMAT or (data and set(data) <= set(VerifyConfig.model_fields)):
        try:
            return LoadedConfig(VerifyConfig.model_validate(data), [], "moe-overlap")
        except ValidationError as exc:
            raise _as_error(exc) from None
    parsed = parse_megatron(data)
    cfg, notes = map_megatron(parsed)
    return LoadedConfig(cfg, notes, "megatron", parsed)
