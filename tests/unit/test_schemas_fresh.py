"""Every committed schema equals what its pydantic model generates (one source of truth)."""

import pytest
from jsonschema import Draft202012Validator

from moe_overlap.skill.card.schemas import SCHEMA_MODELS, generate_schema, load_schema, render


@pytest.mark.parametrize("name", sorted(SCHEMA_MODELS))
def test_schema_matches_model(name):
    assert render(load_schema(name)) == render(generate_schema(name)), (
        f"schemas/{name} is stale: run `python tools/gen_schemas.py`"
    )


@pytest.mark.parametrize("name", sorted(SCHEMA_MODELS))
def test_schema_is_valid_2020_12(name):
    Draft202012Validator.check_schema(load_schema(name))


def test_mcp_tool_input_schemas_match_their_models():
    from moe_overlap.mcp import catalog

    assert catalog.FILE.read_text(encoding="utf-8") == catalog.render(catalog.generate()), (
        "moe_overlap/mcp/tool_inputs.json is stale: run `python tools/gen_schemas.py`")
    for schema in catalog.published().values():
        Draft202012Validator.check_schema(schema)
