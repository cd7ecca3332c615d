"""Lean JSON Schemas for `tools/list`.

An assistant pays for every character of `tools/list` on every turn. pydantic's schemas carry a
`title` per property (the field name again, capitalised), an `anyOf: [X, {"type": "null"}]` wrapper
around every optional field, `"default": null`, and `$defs` for models used once.

- `lean_input`: no titles, no null wrappers (an omitted argument takes its default), single-use
  definitions inlined, no guard-rail limits; descriptions, enums, real bounds, defaults and examples stay.
- `lean_output`: the result's required keys and where its complete schema is (a resource under
  moe-overlap://schemas/): the output schema referenced, not repeated in every tools/list.

Results leave out a null field that has a default (jsonout.lean_dump), so they validate against the
complete schema as pydantic writes it. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any

_NULL = {"type": "null"}
# Keywords whose value is a schema, a list of schemas, or a name -> schema map.
_ONE = ("items", "additionalProperties", "not", "contains", "propertyNames", "if", "then", "else")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "patternProperties", "$defs", "dependentSchemas")
# Limits that only stop absurd input (a 4096-way EP, a 256 KiB config, any string length): the server
# enforces them and says so in its error; they would guide no real call, so the schema leaves them out.
_GUARD_RAILS = {"maximum": 1000, "maxItems": 50, "maxProperties": 50, "maxLength": 0}


def _strip_null(node: dict[str, Any]) -> dict[str, Any]:
    """`anyOf: [X, null]` -> X, keeping the wrapper's own keywords (description, default, ...)."""
    arms = node.get("anyOf")
    if not isinstance(arms, list) or _NULL not in arms:
        return node
    rest = [a for a in arms if a != _NULL]
    out = {k: v for k, v in node.items() if k != "anyOf"}
    if len(rest) == 1:
        out = {**rest[0], **out}
    else:
        out["anyOf"] = rest
    if "default" in out and out["default"] is None:
        del out["default"]
    return out


def _walk(node: Any) -> Any:
    if isinstance(node, list):
        return [_walk(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = _strip_null(node)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in _MAP and isinstance(value, dict):
            out[key] = {name: _walk(sub) for name, sub in value.items()}
        elif key in _ONE or key in _MANY:
            out[key] = _walk(value)
        elif key == "exclusiveMinimum" and value == 0 and node.get("type") == "integer":
            out["minimum"] = 1  # the same bound, shorter
        elif key in _GUARD_RAILS and isinstance(value, int | float) and value >= _GUARD_RAILS[key]:
            continue
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    return out


def _inline_single_use(schema: dict[str, Any]) -> dict[str, Any]:
    """Definitions referenced once are put where they are used; shared ones stay in `$defs`."""
    defs = schema.get("$defs")
    if not isinstance(defs, dict):
        return schema
    text = json.dumps(schema)
    once = {n for n in defs if text.count(f'"#/$defs/{n}"') == 1 and f'"#/$defs/{n}"' not in json.dumps(defs[n])}

    def sub(node: Any) -> Any:
        if isinstance(node, list):
            return [sub(x) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.removeprefix("#/$defs/") in once:
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            return sub({**defs[ref.removeprefix("#/$defs/")], **siblings})
        return {k: sub(v) for k, v in node.items() if k != "$defs"}

    out = sub(schema)
    kept = {name: sub(d) for name, d in defs.items() if name not in once}
    if kept:
        out["$defs"] = kept
    return out


def lean_input(schema: dict[str, Any]) -> dict[str, Any]:
    """An input schema without titles and null wrappers (an omitted argument takes its default)."""
    out = _inline_single_use(_walk(schema))
    out.pop("description", None)  # the tool's description says it
    return out


def lean_output(schema: dict[str, Any], *, full: str | None = None) -> dict[str, Any]:
    """An object with the result's required keys, and the URI of the complete schema.

    Every result also carries optional keys (left out when empty); they, and every nested shape, are in
    the complete schema, which a client reads once if it needs them.
    """
    out: dict[str, Any] = {"type": "object"}
    if schema.get("required"):
        out["required"] = list(schema["required"])
    if full:
        out["description"] = f"schema: {full}"
    return out
