"""The one JSON spelling of a result: what `--format json` prints and what an MCP tool returns.

Compact (no indentation: a script or an assistant reads it, not a person), strict (RFC 8259 has no NaN or
Infinity: a non-finite number is written as null) and lean: a field that is None and has a default is
left out, so a result has the same shape on the CLI and over MCP, and still validates against the schema
pydantic writes for it (schemas/). Torch-free.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

from pydantic import BaseModel


def lean_dump(result: BaseModel) -> dict[str, Any]:
    """A result as JSON data, leaving out fields that are None and have a default (required ones stay)."""
    data = result.model_dump(mode="json", by_alias=True)
    _prune(result, data)
    return data


def _prune(obj: Any, data: Any) -> None:
    if isinstance(obj, BaseModel) and isinstance(data, dict):
        for name, field in type(obj).model_fields.items():
            key = field.alias or name
            if key not in data:
                continue
            value = getattr(obj, name)
            if value is None and not field.is_required():
                del data[key]
            else:
                _prune(value, data[key])
    elif isinstance(obj, list | tuple) and isinstance(data, list):
        for item, dumped in zip(obj, data, strict=False):
            _prune(item, dumped)
    elif isinstance(obj, dict) and isinstance(data, dict):
        for key, value in obj.items():
            if key in data:
                _prune(value, data[key])


def json_data(obj: Any) -> Any:
    """A result (a model, a list of models, a dataclass, plain data) as JSON data."""
    if isinstance(obj, BaseModel):
        return lean_dump(obj)
    if isinstance(obj, list | tuple):
        return [json_data(x) for x in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    return obj


def finite(data: Any) -> Any:
    """`data` with every NaN / Infinity replaced by None (inputs are range-checked; this is the last guard)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: finite(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [finite(v) for v in data]
    return data


def compact_json(data: Any) -> str:
    """No indentation, no spaces after separators, UTF-8 as is, strict JSON."""
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    except ValueError:  # a NaN or Infinity somewhere
        return json.dumps(finite(data), separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
