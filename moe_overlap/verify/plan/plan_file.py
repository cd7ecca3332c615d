"""plan.json: what `moe-overlap verify --judge DIR` needs to rebuild a run's plan (torch-free).

Written into every run folder (a local run, or --print-launch for torchrun/Slurm) beside config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from moe_overlap.verify.plan.build import Plan

PLAN_FILE = "plan.json"
MAX_PLAN_BYTES = 1_000_000
MAX_RANKS = 4096


class _Spec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Literal["baseline", "overlap", "overlap+wgrad"]
    schedule: Literal["none", "chunked", "1f1b"]
    delay_wgrad: bool


class PlanFile(BaseModel):
    """plan.json as a run writes it, validated when read back (--judge): a damaged or hand-made file is refused
    naming the field, and nothing in it can make the judge loop or read without bound (nproc <= MAX_RANKS)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    config_source: str = Field(max_length=4096)
    config_kind: Literal["default", "moe-overlap", "megatron"]
    nproc: int = Field(ge=1, le=MAX_RANKS)
    device: Literal["cpu", "cuda"]
    specs: list[_Spec] = Field(min_length=1, max_length=3)
    notes: list[str] = Field(default_factory=list, max_length=1000)
    mapping_notes: list[str] = Field(default_factory=list, max_length=1000)
    raw_source: str | dict[str, Any] | None = None
    run_id: str | None = Field(None, max_length=64)
    fabric: Literal["native", "emulated-net"] = "native"
    a2a: Literal["nccl", "ce", "auto"] | None = None
    sm_margin: Annotated[int, Field(ge=0, le=1024, strict=True)] | Literal["auto"] = "auto"
    explain: bool = True
    max_steps: int | None = Field(None, ge=0, le=1_000_000)


def save_plan(plan: Plan) -> Path:
    """plan.json into the (prepared) run folder: every run, local ones too, can be judged again with --judge."""
    data = {"config_source": plan.config_source, "config_kind": plan.config_kind, "nproc": plan.nproc,
            "device": plan.device, "specs": [s.to_dict() for s in plan.specs], "notes": plan.notes,
            "mapping_notes": plan.mapping_notes, "fabric": plan.fabric, "a2a": plan.a2a, "sm_margin": plan.sm_margin,
            "explain": plan.explain,
            "max_steps": plan.max_steps, "run_id": plan.run_id,
            "raw_source": plan.raw_source if isinstance(plan.raw_source, dict | None) else str(plan.raw_source)}
    path = plan.out / PLAN_FILE
    with open(path, "x", encoding="utf-8") as f:  # a new file in the run's own folder (outdir.py)
        f.write(json.dumps(data, indent=2) + "\n")
    return path
