"""The closed sets an MCP argument may take, read from the tables the tools check against.

Why a module of its own: an enum in the input schema is the cheapest guidance an assistant gets (it
picks a valid value instead of guessing and reading an error), and it must never drift from what the
tool accepts. Each set is computed from the table the `skill/` code validates with, so adding a preset
there adds it to the schema. Torch-free, and cheap to import (start-up reads these).
"""

from __future__ import annotations

import json
from functools import lru_cache
from itertools import product

from moe_overlap import paths
from moe_overlap.skill.estimate.hardware import GPUS, LINKS
from moe_overlap.skill.estimate.models import MODELS
from moe_overlap.skill.models.shapes import MODELS as SHAPES
from moe_overlap.skill.rules.environment import GPU_CAPABILITY

SKILL = "perf-expert-parallel-overlap"
# A compute capability as the validator reads it: 9.0, 90, sm_90, sm90, compute_90.
CAPABILITY_PATTERN = r"^(?:[sS][mM]_?|compute_?)?\d{1,2}\.?\d$"


def fabrics() -> tuple[str, ...]:
    """Every fabric spec the estimator takes: one intra-node preset, one inter-node preset, or one of each."""
    intra = sorted(n for n, p in LINKS.items() if p.level == "intra")
    inter = sorted(n for n, p in LINKS.items() if p.level == "inter")
    return (*intra, *inter, *(f"{a}+{b}" for a, b in product(intra, inter)))


def gpu_presets() -> tuple[str, ...]:
    return tuple(sorted(GPUS))


def model_presets() -> tuple[str, ...]:
    """generate_config's model presets."""
    return tuple(n for n, m in SHAPES.items() if not m.layer_only)


def estimate_models() -> tuple[str, ...]:
    """estimate_overlap_benefit's model presets (their shapes and attention FLOPs)."""
    return tuple(sorted(MODELS))


def gpu_names() -> tuple[str, ...]:
    """GPU product names the rules know the compute capability of."""
    return tuple(GPU_CAPABILITY)


def gpu_schema(description: str) -> dict:
    """A GPU argument: a known product name, or a compute capability."""
    return {"anyOf": [{"enum": list(gpu_names())}, {"type": "string", "pattern": CAPABILITY_PATTERN}],
            "description": description}


@lru_cache(maxsize=1)
def skill_names() -> tuple[str, ...]:
    base = paths.skills_dir()
    return tuple(sorted(p.name for p in base.iterdir() if (p / "SKILL.md").is_file())) if base.is_dir() else ()


@lru_cache(maxsize=1)
def card_sections() -> tuple[str, ...]:
    """The card's top-level sections (sorted), from the committed card schema: no model import at start-up."""
    schema = json.loads((paths.schemas_dir() / "card.schema.json").read_text(encoding="utf-8"))
    return tuple(schema["properties"])
