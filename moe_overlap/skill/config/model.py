"""The EP-overlap training config: one pydantic model fed from YAML/JSON, dicts, dotted overrides or Megatron-LM argv.

Sections and field names are Megatron-Bridge's ``ConfigContainer`` ones (``model:``, ``comm_overlap:``,
``ddp:``, ``train:``); field names inside ``model:`` are Megatron-Core ``TransformerConfig`` names.
Unknown keys are kept (each section allows extras) and reported as info notes with a did-you-mean.
A ``comm_overlap`` value that is set overrides the model's (and ddp's), as Bridge's ``CommOverlapConfig`` does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator

from moe_overlap.skill.config.argv import parse_argv
from moe_overlap.skill.config.bridge import flags_turned_off, grad_reduce, overlap_flags
from moe_overlap.skill.config.load import ConfigError, check_values, parse_text, parse_value, read_file
from moe_overlap.skill.config.megatron_lm import layout_stages
from moe_overlap.skill.config.names import did_you_mean, near_miss

__all__ = ["ConfigError", "ConfigNote", "OverlapConfig", "parse_config", "effective_values"]

DispatcherType = Literal["allgather", "alltoall", "flex"]
FlexBackend = Literal["deepep", "hybridep", "ncclep"]
# Upper limits: far above any real job, low enough that no rule's arithmetic can overflow or take long.
MAX_PARALLEL = 65_536  # TP, PP, CP, EP degree; experts
MAX_LAYERS = 100_000
MAX_SIZE = 1 << 24  # hidden-like sizes, data-parallel size
MAX_BATCH = 1 << 32
MAX_LIST = 256


class _Section(BaseModel):
    model_config = ConfigDict(extra="allow", validate_assignment=False)


class ModelSection(_Section):
    """Model-parallel and MoE fields (Megatron-Core ``TransformerConfig`` names)."""

    overlap_moe_expert_parallel_comm: bool = False
    delay_wgrad_compute: bool = False
    expert_model_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL, description="EP size")
    num_moe_experts: int | None = Field(None, ge=0, le=MAX_PARALLEL, description="experts per MoE layer")
    moe_token_dispatcher_type: DispatcherType = "allgather"
    moe_flex_dispatcher_backend: FlexBackend | None = Field(None, description="None: not set")
    moe_enable_deepep: bool = Field(False, description="deprecated: flex + deepep")
    bf16: bool = False
    fp16: bool = False
    tensor_model_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL)
    pipeline_model_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL)
    virtual_pipeline_model_parallel_size: int | None = Field(None, ge=1, le=MAX_LAYERS)
    num_layers_per_virtual_pipeline_stage: int | None = Field(None, ge=1, le=MAX_LAYERS)
    num_virtual_stages_per_pipeline_rank: int | None = Field(None, ge=1, le=MAX_LAYERS)
    pipeline_model_parallel_layout: str | None = Field(None, max_length=4096, description="e.g. 'Ettt|(tt|)*3,L'")
    num_layers: int | None = Field(None, ge=1, le=MAX_LAYERS)
    context_parallel_size: int = Field(1, ge=1, le=MAX_PARALLEL)
    recompute_granularity: Literal["full", "selective"] | None = None
    recompute_method: Literal["uniform", "block"] | None = None
    recompute_num_layers: int | None = Field(None, ge=0, le=MAX_LAYERS)
    recompute_modules: list[str] | None = Field(None, max_length=MAX_LIST)
    moe_shared_expert_overlap: bool = False
    moe_shared_expert_intermediate_size: int | None = Field(None, ge=1, le=MAX_SIZE)
    mtp_num_layers: int | None = Field(None, ge=0, le=MAX_LAYERS)
    cuda_graph_impl: Literal["none", "local", "transformer_engine", "full_iteration"] = Field(
        "none", description="full_iteration: megatron-core >= 0.18")
    cuda_graph_scope: list[str] | None = Field(
        None, max_length=MAX_LIST, description="megatron-core <= 0.17 name; `cuda_graph_modules` from 0.18 (both accepted)")
    fine_grained_activation_offloading: bool = False
    offload_modules: list[str] | None = Field(None, max_length=MAX_LIST)
    moe_grouped_gemm: bool = True
    moe_use_legacy_grouped_gemm: bool = False
    gradient_accumulation_fusion: bool | None = Field(
        None, description="None: not set (Bridge and Megatron-LM turn it on when TE is present)")
    add_bias_linear: bool = True
    add_qkv_bias: bool = False
    transformer_impl: Literal["transformer_engine", "local", "inference_optimized"] | None = Field(
        None, description="None: not set (Megatron-LM and Bridge default to transformer_engine)")
    ep_overlap_early_attn_memory_release: bool = Field(False, description="needs the EP overlap")
    overlap_dispatch_backward_with_experts_wgrad: bool = Field(
        False, description="megatron-core >= 0.18: an alternative to EP overlap, excludes it")

    @field_validator("cuda_graph_scope", "recompute_modules", "offload_modules", mode="before")
    @classmethod
    def _comma_string_to_list(cls, value: Any) -> Any:
        # Megatron accepts "attn,moe_router" as well as a list; "full" is the old spelling of "whole layer".
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


class CommOverlapSection(_Section):
    """Bridge ``CommOverlapConfig``: a value set here overrides the model's / ddp's."""

    overlap_moe_expert_parallel_comm: bool | None = None
    delay_wgrad_compute: bool | None = None
    overlap_grad_reduce: bool | None = None
    overlap_param_gather: bool | None = None
    tp_comm_overlap: bool | None = None
    data_parallel_size: int | None = Field(None, ge=1, le=MAX_SIZE)


class DdpSection(_Section):
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    use_distributed_optimizer: bool = False
    use_megatron_fsdp: bool = False
    fsdp_double_buffer: bool = False


class TrainSection(_Section):
    global_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    micro_batch_size: int | None = Field(None, ge=1, le=MAX_BATCH)
    data_parallel_size: int | None = Field(None, ge=1, le=MAX_SIZE, description="not a Bridge field: lets the validator "
                                           "count micro-batches per data-parallel rank")


class ConfigNote(BaseModel):
    """Something the parser did or noticed (unknown key, renamed field, derived value): reported as info."""

    kind: Literal["unknown-key", "renamed-field", "derived-value", "wrong-section", "layer-split"] = Field(
        description="layer-split: a pipeline split Megatron-LM's argument checks refuse (an error)")
    path: str
    message: str


class OverlapConfig(BaseModel):
    """An EP-overlap training config in Megatron-Bridge ConfigContainer layout (other sections kept as-is)."""

    model_config = ConfigDict(extra="allow")

    model: ModelSection = Field(default_factory=ModelSection)
    comm_overlap: CommOverlapSection = Field(default_factory=CommOverlapSection)
    ddp: DdpSection = Field(default_factory=DdpSection)
    train: TrainSection = Field(default_factory=TrainSection)
    mixed_precision: str | dict[str, Any] | None = Field(
        None, description='Bridge mixed-precision recipe, e.g. "bf16_mixed" (sets model.bf16)')

    _notes: list[ConfigNote] = PrivateAttr(default_factory=list)
    _argv_flags: list[str] = PrivateAttr(default_factory=list)  # the mapped Megatron-LM flags given
    _argv_only: bool = PrivateAttr(default=False)  # Megatron-LM flags alone: Megatron-LM reads it

    @property
    def notes(self) -> list[ConfigNote]:
        return self._notes


SECTIONS: dict[str, type[_Section]] = {
    "model": ModelSection, "comm_overlap": CommOverlapSection, "ddp": DdpSection, "train": TrainSection,
}
# Other Bridge ConfigContainer sections: kept, never read, not worth a note.
QUIET_SECTIONS = {"optimizer", "scheduler", "dataset", "logger", "tokenizer", "checkpoint", "dist", "rng",
                  "rerun_state_machine", "profiling", "peft", "ft", "straggler", "nvrx_straggler",
                  "inprocess_restart", "mixed_precision"}
RENAMED = {"cuda_graph_modules": "cuda_graph_scope"}  # later Megatron-Core name -> our canonical name


def _did_you_mean(key: str, choices: Sequence[str]) -> str:
    return did_you_mean(key, choices)


def _known_names() -> set[str]:
    """Every name the parser reads or knows: sections, quiet sections, section fields, renamed fields."""
    names = set(SECTIONS) | QUIET_SECTIONS | set(RENAMED) | set(OverlapConfig.model_fields)
    for model in SECTIONS.values():
        names |= set(model.model_fields)
    return names


def looks_like_config(data: Mapping[str, Any]) -> bool:
    """A mapping naming at least one known section or field (what a file without a config suffix must be)."""
    known = _known_names()
    return any(isinstance(k, str) and k in known for k in data)


def _near_miss_error(path: str, key: str, candidates: set[str], where: str) -> ConfigError | None:
    close = near_miss(key, candidates)
    if close is None:
        return None
    return ConfigError(f"unknown key {path!r} is one edit away from {where}{close!r}: a misspelt key is not read, "
                       "so the setting it means would silently keep its default", field=path,
                       fix=f"rename {key!r} to {close!r} (or remove it)")


def _section_of(field: str) -> str | None:
    for name, model in SECTIONS.items():
        if field in model.model_fields or (name == "model" and field in RENAMED):
            return name
    return None


def _normalise(raw: Mapping[Any, Any], notes: list[ConfigNote]) -> dict[str, Any]:
    """Place top-level field names into their section, rename old/new names, note unknown keys."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(key, str):
            raise ConfigError(f"top-level key {key!r} is a {type(key).__name__}; keys must be strings", field=str(key))
        if key in SECTIONS:
            if value is None:
                value = {}
            if not isinstance(value, Mapping):
                raise ConfigError(f"{key}: must be a mapping of fields, got a {type(value).__name__}", field=key)
            out.setdefault(key, {}).update(value)
        elif (section := _section_of(key)) is not None:
            out.setdefault(section, {})[key] = value
            notes.append(ConfigNote(kind="derived-value", path=f"{section}.{key}",
                                    message=f"top-level key {key!r} read as {section}.{key}"))
        else:
            if key not in QUIET_SECTIONS and (err := _near_miss_error(key, key, _known_names(), "")) is not None:
                raise err
            out[key] = value
            if key not in QUIET_SECTIONS:
                notes.append(ConfigNote(kind="unknown-key", path=key, message=(
                    f"unknown top-level key {key!r} kept, not read{_did_you_mean(key, list(SECTIONS))}")))
    for section, model in SECTIONS.items():
        fields = out.get(section)
        if not fields:
            continue
        for key in list(fields):
            if not isinstance(key, str):
                raise ConfigError(f"{section}: key {key!r} is a {type(key).__name__}; keys must be strings",
                                  field=f"{section}.{key}")
            if key in RENAMED and section == "model":
                new = RENAMED[key]
                if new in fields and fields[new] != fields[key]:
                    raise ConfigError(f"model.{key} and model.{new} are the same setting with different values",
                                      field=f"model.{key}", fix=f"keep only one of {key} / {new}")
                fields[new] = fields.pop(key)
                notes.append(ConfigNote(kind="renamed-field", path=f"model.{key}", message=(
                    f"model.{key} (megatron-core >= 0.18 name) read as model.{new} (<= 0.17 name); "
                    "both are accepted")))
            elif key not in model.model_fields and (other := _section_of(key)) is not None:
                _misplaced(out, section, other, key, notes)
            elif key not in model.model_fields:
                own = set(model.model_fields) | (set(RENAMED) if section == "model" else set())
                err = (_near_miss_error(f"{section}.{key}", key, own, f"{section}.")
                       or _near_miss_error(f"{section}.{key}", key, _known_names() - set(SECTIONS), ""))
                if err is not None:
                    raise err
                hint = _did_you_mean(key, list(model.model_fields))
                notes.append(ConfigNote(kind="unknown-key", path=f"{section}.{key}",
                                        message=f"unknown key {section}.{key} kept, not read{hint}"))
    return out


def _misplaced(out: dict[str, Any], section: str, other: str, key: str, notes: list[ConfigNote]) -> None:
    """A known field under the wrong section: Bridge would not read it there (a checker that ignored it would
    miss what it was meant to say), so it is read from its own section unless set there too, and reported."""
    target = out.setdefault(other, {})
    if not isinstance(target, dict):
        target = {}
    read = key not in target
    if read:
        target[key] = out[section][key]
    notes.append(ConfigNote(kind="wrong-section", path=f"{section}.{key}", message=(
        f"{section}.{key} belongs in {other}: Megatron-Bridge does not read it under {section}:; "
        + (f"read here as {other}.{key}" if read else f"{other}.{key} is also set and wins") + "; move it")))


def _apply_override(data: dict[str, Any], item: str) -> None:
    key, eq, text = item.partition("=")
    key = key.strip()
    if not eq or not key:
        raise ConfigError(f"override {item!r} is not KEY=VALUE", fix="e.g. --set comm_overlap.delay_wgrad_compute=true")
    parts = key.split(".")
    if len(parts) == 1 and (section := _section_of(key)) is not None:
        parts = [section, key]
    value = parse_value(text, name=key) if text.strip() else None
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise ConfigError(f"override {key}: {part} is not a section", field=key)
        node = nxt
    node[parts[-1]] = value


def _load(source: Any) -> dict[str, Any]:
    if isinstance(source, Mapping):
        return check_values(source)  # a copy: the caller's dict is never modified
    if isinstance(source, OverlapConfig):
        return source.model_dump(exclude_unset=True)
    if isinstance(source, Path):
        return read_file(source, recognised=looks_like_config)
    if isinstance(source, str):
        # One short line that is not "key: value" is a file name; anything else is YAML text.
        if source.strip() and "\n" not in source and ": " not in source and len(source) < 4096:
            return read_file(Path(source), recognised=looks_like_config)
        return parse_text(source)
    raise ConfigError(f"config must be a mapping, a path or YAML text, got a {type(source).__name__}")


def _validation_error(exc: ValidationError) -> ConfigError:
    err = exc.errors()[0]
    path = ".".join(str(p) for p in err["loc"])
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if err["type"] == "literal_error":
        choices = [c.strip().strip("'") for c in str(ctx.get("expected", "")).replace(" or ", ", ").split(",")]
        hint = _did_you_mean(str(value), choices) if isinstance(value, str) else ""
        return ConfigError(f"{path}: {value!r} is not one of {', '.join(choices)}{hint}", field=path, choices=choices)
    shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
    return ConfigError(f"{path}: {err['msg'].lower()}, got {shown}", field=path)


def parse_config(source: Any = None, overrides: Sequence[str] = (), *,
                 argv: str | Sequence[str] | None = None) -> OverlapConfig:
    """Parse a config from a dict / path / YAML text, then Megatron-LM `argv`, then dotted `overrides` (last wins).

    Raises ConfigError (one message naming the field) on any bad input. An OverlapConfig with nothing to add
    is returned as it is, notes included (parsed once, it is never dumped and re-read).
    """
    if isinstance(source, OverlapConfig) and not overrides and not argv:
        return source
    notes: list[ConfigNote] = []
    argv_flags: list[str] = []
    data: dict[str, Any] = _load(source) if source is not None else {}
    if argv:
        sections, argv_notes, argv_flags = parse_argv(argv)
        for section, fields in sections.items():
            target = data.setdefault(section, {})
            if not isinstance(target, dict):
                raise ConfigError(f"{section}: must be a mapping of fields", field=section)
            target.update(fields)
        notes.extend(ConfigNote(kind=kind, path=path, message=msg) for kind, path, msg in argv_notes)
    for item in overrides:
        _apply_override(data, item)
    normalised = _normalise(check_values(data) if overrides or argv else data, notes)
    try:
        cfg = OverlapConfig.model_validate(normalised)
    except ValidationError as exc:
        raise _validation_error(exc) from None
    cfg._notes = notes + [ConfigNote(kind="wrong-section", path=path, message=message)
                          for path, message in flags_turned_off(cfg)]
    cfg._argv_flags = argv_flags if argv else []
    cfg._argv_only = bool(argv) and source is None
    return cfg


def effective_values(cfg: OverlapConfig) -> tuple[dict[str, Any], dict[str, str]]:
    """The values the rules read, after Bridge's precedence, and the dotted path each one came from."""
    values: dict[str, Any] = {}
    paths: dict[str, str] = {}
    for name in ModelSection.model_fields:
        values[name] = getattr(cfg.model, name)
        paths[name] = f"model.{name}"
    for name, (value, path) in overlap_flags(cfg).items():  # Bridge's precedence (bridge.py)
        values[name] = value
        if path:
            paths[name] = path
    values["overlap_grad_reduce"], paths["overlap_grad_reduce"] = grad_reduce(cfg)
    override = cfg.comm_overlap.overlap_param_gather
    values["overlap_param_gather"] = override if override is not None else cfg.ddp.overlap_param_gather
    paths["overlap_param_gather"] = "comm_overlap.overlap_param_gather" if override is not None \
        else "ddp.overlap_param_gather"
    for name in ("use_megatron_fsdp", "fsdp_double_buffer"):
        values[name] = getattr(cfg.ddp, name)
        paths[name] = f"ddp.{name}"
    mp = cfg.mixed_precision
    if isinstance(mp, str) and not (values["bf16"] or values["fp16"]):
        values["bf16"] = values["bf16"] or "bf16" in mp
        values["fp16"] = values["fp16"] or ("fp16" in mp and "bf16" not in mp)
    elif isinstance(mp, dict):
        values["bf16"] = values["bf16"] or bool(mp.get("bf16"))
        values["fp16"] = values["fp16"] or bool(mp.get("fp16"))
    if values["moe_enable_deepep"] and values["moe_flex_dispatcher_backend"] != "hybridep":
        # What Megatron-Core does with the deprecated switch: any backend but hybridep (an error of its own)
        # becomes deepep, ncclep too (transformer_config.py __post_init__; megatron-core 0.19.2 line 1594).
        values["moe_flex_dispatcher_backend"] = "deepep"
    if values["virtual_pipeline_model_parallel_size"] is None and values["num_layers_per_virtual_pipeline_stage"]:
        values["virtual_pipeline_model_parallel_size"] = "derived"  # Megatron-LM derives VPP from this flag
        paths["virtual_pipeline_model_parallel_size"] = "model.num_layers_per_virtual_pipeline_stage"
    layout = getattr(cfg.model, "pipeline_model_parallel_layout", None)
    stages = layout_stages(layout) if values["virtual_pipeline_model_parallel_size"] is None and layout else None
    if stages and len(stages) // (values["pipeline_model_parallel_size"] or 1) > 1:
        # stages / PP, as Megatron-LM and Core derive it; one stage per rank is no virtual pipeline (VPP 1 -> None)
        values["virtual_pipeline_model_parallel_size"] = "derived"
        paths["virtual_pipeline_model_parallel_size"] = "model.pipeline_model_parallel_layout"
    values["global_batch_size"] = cfg.train.global_batch_size
    values["micro_batch_size"] = cfg.train.micro_batch_size
    values["data_parallel_size"] = cfg.train.data_parallel_size or cfg.comm_overlap.data_parallel_size
    paths.update(global_batch_size="train.global_batch_size", micro_batch_size="train.micro_batch_size",
                 data_parallel_size="train.data_parallel_size")
    return values, paths
