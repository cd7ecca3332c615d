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
