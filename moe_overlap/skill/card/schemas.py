"""The JSON Schema files under schemas/ and the pydantic models they are generated from.

One source of truth: each schema file is generated from its model (``python tools/gen_schemas.py``),
and a test fails when a committed schema differs from what its model generates.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from moe_overlap.paths import schemas_dir

# file name under schemas/ -> "module:ModelName". Add one line per schema.
SCHEMA_MODELS: dict[str, str] = {
    "overlap-config.schema.json": "moe_overlap.skill.config.model:OverlapConfig",
    "validation-result.schema.json": "moe_overlap.skill.rules.validate:ValidationResult",
    "card.schema.json": "moe_overlap.skill.card.model:Card",
    "evals.schema.json": "moe_overlap.skill.card.evals:EvalSet",
    "verification-report.schema.json": "moe_overlap.verify.judge.report_model:VerificationReport",
    "generate-result.schema.json": "moe_overlap.skill.generate.model:GenerateResult",
    "estimate-result.schema.json": "moe_overlap.skill.estimate.model:EstimateResult",
    # The other tool results, which the MCP server's output schemas point to.
    "skill-list.schema.json": "moe_overlap.skill.card.contents:SkillList",
    "card-read.schema.json": "moe_overlap.skill.card.contents:CardRead",
    "log-check-result.schema.json": "moe_overlap.skill.diagnose.log_output:LogCheckOutput",
    "diagnosis-result.schema.json": "moe_overlap.skill.diagnose.api:DiagnosisResult",
    "verification-status.schema.json": "moe_overlap.mcp.results:VerificationStatus",
}

DIALECT = "https://json-schema.org/draft/2020-12/schema"


def resolve(dotted: str):
    """The object named by "module:Name" (imported on demand, so callers stay light at start-up)."""
    module, _, name = dotted.partition(":")
    return getattr(importlib.import_module(module), name)


def generate_schema(file_name: str) -> dict[str, Any]:
    """The schema of `file_name` as its pydantic model generates it (2020-12 dialect, stable id)."""
    model = resolve(SCHEMA_MODELS[file_name])
    schema = model.model_json_schema(mode="validation")
    return {"$schema": DIALECT, "$id": f"https://moe-overlap.dev/schemas/{file_name}", **schema}


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def load_schema(file_name: str) -> dict[str, Any]:
    """The committed schema file (what users and other tools read)."""
    path: Path = schemas_dir() / file_name
    return json.loads(path.read_text(encoding="utf-8"))
