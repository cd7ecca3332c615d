"""VerifyOptions: how to run a verification (what `moe-overlap verify` flags and the MCP tool fill in).

The config (:mod:`moe_overlap.verify.plan.config`) says *what* model and overlap to verify; the options say
*how* to run it here: ranks, device, modes, limits, output folder. Options given explicitly override the
config's steps / micro-batches / schedule.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MODES = ("baseline", "overlap", "overlap+wgrad")
# A partition or account name goes into the sbatch script: letters, digits and -_. only (no shell, no newline).
SlurmName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class VerifyOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    config: str | Path | dict[str, Any] | None = Field(
        None, description="moe-overlap or Megatron-Bridge-style config (path or dict); None: the embedded default")
    nproc: int | None = Field(None, ge=1, le=1 << 20, description="ranks; default: the config's expert_model_parallel_size")
    device: Literal["cpu", "cuda"] = "cpu"
    steps: int | None = Field(None, ge=2, le=100_000, description="optimizer steps per mode (overrides the config)")
    max_steps: int | None = Field(None, ge=2, le=100_000, description="with --device cuda, keep stepping past "
                                  "`steps`, up to this many, until the throughput judgement is settled; default 5 x "
                                  "steps (at most steps + 200); cpu: steps")
    micro_batches: int | None = Field(None, ge=1, le=256)
    modes: list[str] | None = Field(None, description="subset of baseline, overlap, overlap+wgrad; default all "
                                                      "that apply to the schedule")
    schedule: Literal["chunked", "1f1b"] | None = Field(None, description="the overlap schedule; default 1f1b when "
                                                                          "the package has it, else chunked")
    fabric: Literal["native", "emulated-net"] = Field(
        "native", description="NCCL fabric of every rank (ep/fabric.py): native, or emulated-net (NCCL's network "
                              "transport over loopback: the all-to-all behaves like an inter-node link); cuda only")
    a2a: Literal["nccl", "ce", "auto"] | None = Field(
        None, description="all-to-all transport (ep/transport.py): nccl, ce (copy engines, one host), auto; "
                          "default: auto on cuda with the native fabric (copy engines when every rank is on one "
                          "host, NCCL otherwise), the process group's own otherwise (NCCL, gloo on cpu). With auto "
                          "the baseline takes the faster alone of NCCL and copy engines, timed in the ranks before "
                          "training (report.json: environment.baseline_transport, a2a_alone_ms)")
    sm_margin: Annotated[int, Field(ge=0, le=1024, strict=True)] | Literal["auto"] = Field(
        "auto", description="cuda, 1f1b: SMs the expert GEMMs leave to the all-to-all kernels beside them "
                            "(ep/sm_margin.py); auto: 8 for NCCL over a network link (several hosts, or "
                            "--fabric emulated-net), else 0")
    explain: bool = Field(True, description="after training, time the step's all-to-alls and expert GEMMs alone in "
                                            "the same ranks (the report's split of the step time)")
    timeout_s: float = Field(600.0, gt=0, le=30 * 86400, description="wall-clock limit of the whole run")
    hang_timeout_s: float = Field(60.0, gt=0, le=86400, description="a rank silent this long is a hang")
    out: str | Path | None = Field(None, description="output folder; default: a new folder under ./verify-out")
    force: bool = Field(False, description="overwrite a folder that already holds a report")
    # Where the ranks run (verify/run/slurm_run.py): here under the local watchdog, or as a Slurm batch job.
    launcher: Literal["local", "slurm"] = Field(
        "local", description="local: ranks on this machine; slurm: submit an sbatch job (srun torchrun on every "
                             "node), track it, judge its folder when it ends, scancel on cancel/timeout")
    nodes: int | None = Field(None, ge=1, le=4096, description="slurm / --print-launch: nodes; default "
                              "ceil(nproc / gpus_per_node)")
    gpus_per_node: int | None = Field(None, ge=1, le=64, description="slurm / --print-launch: ranks per node "
                                      "(GPUs with --device cuda); default 8 on cuda, nproc / nodes on cpu")
    partition: SlurmName | None = Field(None, description="slurm: #SBATCH --partition")
    account: SlurmName | None = Field(None, description="slurm: #SBATCH --account")
    time_limit: Annotated[str, Field(pattern=r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$", max_length=16)] | None = Field(
        None, description="slurm: #SBATCH --time (e.g. 00:30:00); default: the run's timeout")
    # Test-only fault injection (hidden from the CLI help): perturb:MODE, crash:RANK:MODE:STEP, hang:RANK:MODE:STEP.
    inject_fault: str | None = None

    @field_validator("modes")
    @classmethod
    def _known_modes(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        bad = [m for m in v if m not in MODES]
        if bad:
            raise ValueError(f"unknown mode(s) {bad}; choose from {', '.join(MODES)}")
        if not v:
            raise ValueError("modes is empty")
        return [m for m in MODES if m in v]  # canonical order, no duplicates

    @field_validator("inject_fault")
    @classmethod
    def _fault_form(cls, v: str | None) -> str | None:
        if v is None:
            return v
        kind, *rest = v.split(":")
        ok = (kind == "perturb" and len(rest) == 1) or (kind in ("crash", "hang") and len(rest) == 3)
        if not ok:
            raise ValueError("inject_fault must be perturb:MODE, crash:RANK:MODE:STEP or hang:RANK:MODE:STEP")
        return v
