"""The tools' input models and their published input schemas, generated once and read at start-up.

Why a generated file: building the input models (pydantic classes over the `skill/` request models and the
preset tables) and their schemas is most of what the server itself adds to `initialize`. The schemas are
generated from the models by `python tools/gen_schemas.py` into tool_inputs.json, which ships with the
package; a test fails when the committed file differs from what the models generate. The models are
imported on a tool's first call (ArgumentGuard validates with them). Torch-free.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from moe_overlap.skill.card.schemas import resolve

FILE = Path(__file__).with_name("tool_inputs.json")
# tool -> "module:InputModel"
INPUTS: dict[str, str] = {
    "list_skills": "moe_overlap.mcp.inputs:ListSkillsInput",
    "get_skill_card": "moe_overlap.mcp.inputs:GetSkillCardInput",
    "validate_config": "moe_overlap.mcp.inputs:ValidateConfigInput",
    "generate_config": "moe_overlap.mcp.inputs:GenerateInput",
    "check_training_log": "moe_overlap.mcp.inputs:CheckLogInput",
    "diagnose_failure": "moe_overlap.mcp.inputs:DiagnoseInput",
    "estimate_overlap_benefit": "moe_overlap.mcp.inputs:EstimateInput",
    "run_verification": "moe_overlap.mcp.inputs:RunVerificationInput",
    "get_verification_status": "moe_overlap.mcp.inputs:StatusInput",
    "cancel_verification": "moe_overlap.mcp.inputs:CancelInput",
}


@cache
def model(tool: str) -> type[BaseModel]:
    """The input model of `tool`, imported on first use."""
    return resolve(INPUTS[tool])


def generate() -> dict[str, dict[str, Any]]:
    """Every tool's published input schema, from its model (what tool_inputs.json must hold)."""
    from moe_overlap.mcp.schema_compact import lean_input

    return {tool: lean_input(model(tool).model_json_schema()) for tool in INPUTS}


def render(schemas: dict[str, dict[str, Any]]) -> str:
    return json.dumps(schemas, indent=1, ensure_ascii=False) + "\n"  # property order: the model's


@cache
def published() -> dict[str, dict[str, Any]]:
    """The committed schemas; generated from the models instead when the file is missing or lacks a tool
    (a checkout mid-change): slower to start, never wrong."""
    try:
        schemas = json.loads(FILE.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        schemas = {}
    if set(schemas) != set(INPUTS):
        schemas = generate()
    return schemas


def input_schema(tool: str) -> dict[str, Any]:
    return published()[tool]
