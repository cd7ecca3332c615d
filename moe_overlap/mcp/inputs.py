"""Input models of the MCP tools whose arguments are not already a `skill/` request model.

(`generate_config` takes `skill.generate.GenerateRequest` and `estimate_overlap_benefit` takes
`skill.estimate.EstimateRequest` as they are.) Every field has a description: it is what the model
reads in the tool's input schema, and what `toolkit` quotes in a "Fix:" when the value is wrong.
Torch-free.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from moe_overlap.mcp.safety import (
    MAX_CONFIG_CHARS,
    MAX_LOG_CHARS,
    MAX_OVERRIDES,
    MAX_PATH_CHARS,
    MAX_TEXT_CHARS,
)

SKILL = "perf-expert-parallel-overlap"
Mode = Literal["baseline", "overlap", "overlap+wgrad"]


class _Input(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _ConfigSource(_Input):
    """Exactly one way to give a config: a JSON object, YAML/JSON text, or a file under an allowed folder."""

    config: dict[str, Any] | None = Field(
        None, description="the config as a JSON object: sections model/comm_overlap/ddp (Megatron-Bridge names)")
    config_text: str | None = Field(
        None, max_length=MAX_CONFIG_CHARS,
        description="the config as YAML or JSON text")
    config_path: str | None = Field(
        None, max_length=MAX_PATH_CHARS,
        description="path of a YAML/JSON config file inside an allowed folder (relative to the first one)")

    def _count_sources(self) -> int:
        return sum(x is not None for x in (self.config, self.config_text, self.config_path))


class ListSkillsInput(_Input):
    pass


class GetSkillCardInput(_Input):
    name: str = Field(SKILL, max_length=64, description="the skill name, as list_skills returns it")
    field: str | None = Field(
        None, max_length=256,
        description="a dotted path into the card, e.g. 'constraints.ep-size-gt-1' or 'minimal_example.config'; "
                    "list entries by index or by id/name; omit for the whole card")


class ValidateConfigInput(_ConfigSource):
    argv: str | list[str] | None = Field(
        None, max_length=MAX_CONFIG_CHARS,
        description="Megatron-LM command-line flags, e.g. '--expert-model-parallel-size 8 "
                    "--overlap-moe-expert-parallel-comm' (alone, or applied on top of a config)")
    overrides: list[str] = Field(
        default_factory=list, max_length=MAX_OVERRIDES,
        description="dotted key=value overrides applied on top, e.g. 'model.expert_model_parallel_size=8'")
    torch_version: str | None = Field(None, max_length=32, description="PyTorch version of the target, e.g. '2.6.0'")
    te_version: str | None = Field(None, max_length=32, description="Transformer Engine version, e.g. '2.7.0'")
    megatron_core_version: str | None = Field(None, max_length=32, description=(
        "Megatron-Core version, e.g. '0.19.2' (rules known for 0.16-0.19; another gets the nearest and a warning)"))
    gpu: str | None = Field(None, max_length=64, description="GPU of the target, e.g. 'H100' or 'B200'")
    env: dict[str, str] | None = Field(
        None, description="environment variables of the target job (e.g. CUDA_DEVICE_MAX_CONNECTIONS)")

    @model_validator(mode="after")
    def _one_source(self) -> ValidateConfigInput:
        if self._count_sources() > 1 or (self._count_sources() == 0 and self.argv is None):
            raise ValueError("give exactly one of `config` (object), `config_text` (YAML/JSON text) "
                             "or `config_path` (file under an allowed folder), or Megatron-LM flags in `argv`")
        return self


class RunVerificationInput(_Input):
    config: dict[str, Any] | None = Field(
        None, description="the config to verify as a JSON object (moe-overlap format or Megatron-Bridge sections); "
                          "omit all three config fields for the built-in small default")
    config_text: str | None = Field(None, max_length=MAX_CONFIG_CHARS, description="the config as YAML or JSON text")
    config_path: str | None = Field(None, max_length=MAX_PATH_CHARS,
                                    description="path of a config file inside an allowed folder")
    nproc: int | None = Field(None, ge=1, le=8, description="rank processes to spawn (1-8); default: the config's EP size")
    device: Literal["cpu", "cuda"] = Field("cpu", description="'cpu' (gloo) or 'cuda' (NCCL, needs GPUs)")
    steps: int | None = Field(None, ge=2, le=500, description="optimizer steps per mode (2-500)")
    micro_batches: int | None = Field(None, ge=1, le=64, description="micro-batches per step (1-64)")
    modes: list[Mode] | None = Field(None, min_length=1, max_length=3,
                                     description="subset of baseline, overlap, overlap+wgrad; default: all")
    schedule: Literal["chunked", "1f1b"] | None = Field(None, description="the overlap schedule to verify")
    timeout_s: float = Field(600.0, ge=5, le=3600, description="wall-clock limit of the whole run in seconds (5-3600)")
    background: bool = Field(
        False, description="true: return a job handle at once (poll get_verification_status); false: wait and "
                           "report progress. Use true for runs longer than your client's tool timeout (often 60 s)")

    @model_validator(mode="after")
    def _at_most_one_source(self) -> RunVerificationInput:
        if sum(x is not None for x in (self.config, self.config_text, self.config_path)) > 1:
            raise ValueError("give at most one of `config`, `config_text`, `config_path`")
        return self


class JobInput(_Input):
    job_id: str = Field(max_length=64, description="the job handle run_verification returned")


class StatusInput(JobInput):
    wait_s: float = Field(0.0, ge=0, le=50, description="seconds to wait for the job to finish before answering "
                                                        "(0-50; keeps polling cheap while staying under client "
                                                        "tool timeouts)")


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
