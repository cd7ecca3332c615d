"""plan.json: what `moe-overlap verify --judge DIR` needs to rebuild a run's plan (torch-free).

Written into every run folder (a local run, or --print-launch for torchrun/Slurm) beside config.json.
"""

from __future__ import annotations

import json
from pathlib import Path

from moe_overlap.verify.plan import Plan

PLAN_FILE = "plan.json"


def save_plan(plan: Plan) -> Path:
    """plan.json into the (prepared) run folder: every run, local ones too, can be judged again with --judge."""
    data = {"config_source": plan.config_source, "config_kind": plan.config_kind, "nproc": plan.nproc,
            "device": plan.device, "specs": [s.to_dict() for s in plan.specs], "notes": plan.notes,
            "mapping_notes": plan.mapping_notes, "fabric": plan.fabric, "a2a": plan.a2a, "explain": plan.explain,
            "max_steps": plan.max_steps,
            "raw_source": plan.raw_source if isinstance(plan.raw_source, dict | None) else str(plan.raw_source)}
    path = plan.out / PLAN_FILE
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path
