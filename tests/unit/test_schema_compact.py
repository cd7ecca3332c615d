"""mcp.schema_compact: lean schemas and results without losing what validates them."""

from __future__ import annotations

import jsonschema
from pydantic import BaseModel, Field

from moe_overlap.jsonout import compact_json, lean_dump
from moe_overlap.mcp.schema_compact import lean_input, lean_output


class Inner(BaseModel):
    x: int = Field(gt=0, description="a count")
    note: str | None = None


class Args(BaseModel):
    name: str = Field(description="who", max_length=64)
    size: int | None = Field(None, ge=1, le=4096, description="how many")
    inner: Inner | None = None


class Result(BaseModel):
    must: str | None = Field(description="required, may be null")
    maybe: str | None = None
    items: list[Inner] = Field(default_factory=list)


def test_input_schema_keeps_what_guides_a_call_and_drops_the_rest():
    schema = lean_input(Args.model_json_schema())
    text = compact_json(schema)
    assert '"title"' not in text and "null" not in text and "$defs" not in text
    assert schema["properties"]["size"] == {"minimum": 1, "type": "integer", "description": "how many"}
    assert "maxLength" not in schema["properties"]["name"]  # a guard rail the server enforces
    assert schema["properties"]["inner"]["properties"]["x"] == {"description": "a count", "minimum": 1,
                                                                "type": "integer"}
    jsonschema.validate({"name": "a", "size": 3, "inner": {"x": 1}}, schema)


def test_output_schema_lists_required_keys_and_points_to_the_full_one():
    out = lean_output(Result.model_json_schema(), full="moe-overlap://schemas/r.schema.json")
    assert out == {"type": "object", "required": ["must"],
                   "description": "schema: moe-overlap://schemas/r.schema.json"}


def test_lean_dump_drops_optional_nulls_only_and_still_validates():
    result = Result(must=None, items=[Inner(x=1)])
    data = lean_dump(result)
    assert data == {"must": None, "items": [{"x": 1}]}
    jsonschema.validate(data, Result.model_json_schema())
    assert compact_json(data) == '{"must":null,"items":[{"x":1}]}'
