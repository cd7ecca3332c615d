"""Tools from pydantic models: lean published schemas, compact JSON results, argument errors with the fix.

Each tool is (input model, handler(inputs, ctx) -> result model). `model_tool` builds the SDK `Tool`
itself rather than letting the SDK derive it from a Python signature, for three reasons:
- the published schemas are ours: `schema_compact` takes out titles, null wrappers and single-use
  definitions, keeps enums, bounds and examples, and the output schema points to the full one;
- results are compact JSON (the SDK pretty-prints), with null fields left out;
- the arguments reach the handler raw, validated once by the input model with our messages.
`ArgumentGuard` runs first, as server middleware, and answers a bad ``tools/call`` with an ``isError``
result that names each field, what is wrong and the fix (the SDK would silently drop an unknown
argument such as ``backgroud: true``). Torch-free.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import lru_cache
from typing import Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase, FuncMetadata
from mcp.shared.exceptions import MCPError
from mcp.types import INVALID_PARAMS, CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, ConfigDict, ValidationError

from moe_overlap import paths
from moe_overlap.jsonout import compact_json, lean_dump
from moe_overlap.mcp import catalog
from moe_overlap.mcp.schema_compact import lean_output
from moe_overlap.mcp.wording import reword

logger = logging.getLogger(__name__)
Handler = Callable[[Any, Context], Awaitable[BaseModel]]


def annotations(*, read_only: bool, destructive: bool, idempotent: bool, open_world: bool) -> ToolAnnotations:
    """All four hints, always set explicitly (clients treat a missing hint as the unsafe default).

    The title is the tool's own `title`, not repeated here.
    """
    return ToolAnnotations(readOnlyHint=read_only, destructiveHint=destructive, idempotentHint=idempotent,
                           openWorldHint=open_world)


READ_ONLY = annotations(read_only=True, destructive=False, idempotent=True, open_world=False)


class _RawArguments(ArgModelBase):
    """Hands the client's arguments to the tool unchanged: the input model validates them (once)."""

    model_config = ConfigDict(extra="allow", arbitrary_types_allowed=True)

    def model_dump_one_level(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


def structured(result: BaseModel) -> CallToolResult:
    """A result as structured content and, for clients that read text only, the same JSON compact.

    Commands of the `moe-overlap` CLI in the result's text become the MCP tool calls that do the same.
    """
    data = reword(lean_dump(result))
    return CallToolResult(content=[TextContent(type="text", text=compact_json(data))], structured_content=data)


def schema_uri(name: str) -> str:
    """The resource of a result's complete JSON Schema (schemas/<name>.schema.json)."""
    return f"moe-overlap://schemas/{name}.schema.json"


def output_schema(name: str) -> dict[str, Any]:
    """The published output schema of a result whose complete schema is schemas/<name>.schema.json.

    Read from the committed file (generated from the result model, a test keeps it fresh): the server
    starts without importing any result model.
    """
    full = json.loads((paths.schemas_dir() / f"{name}.schema.json").read_text(encoding="utf-8"))
    return lean_output(full, full=schema_uri(name))


def model_tool(guard: ArgumentGuard, *, name: str, title: str, description: str, handler: Handler,
               hints: ToolAnnotations, result_schema: str) -> Tool:
    """The SDK Tool running `handler` on the validated arguments of the tool's input model (catalog.py).

    The input schema is the committed one (catalog.py) and the model is imported on the first call;
    `result_schema`: the result's schema under schemas/ (the published output schema lists its required
    keys and points to it; see schema_compact.lean_output).
    """

    async def tool(ctx: Context, **arguments: Any) -> CallToolResult:
        input_model = catalog.model(name)
        try:
            inputs = input_model.model_validate(pre_parse(input_model, arguments))
        except ValidationError as exc:
            # Reached only without the middleware (MCPServer.call_tool in tests): same message.
            raise ToolError(argument_problems(name, input_model, arguments) or str(exc)) from None
        try:
            return structured(await handler(inputs, ctx))
        except (ToolError, MCPError):
            raise
        except Exception as exc:
            # A bug, not bad input: the traceback goes to stderr; the model still learns what failed
            # instead of the SDK's bare "Error executing tool".
            logger.exception("tool %s crashed", name)
            raise ToolError(f"internal error in `{name}`: {type(exc).__name__}: {exc}. This is a bug in "
                            "moe-overlap, not in your input; the server log (stderr) has the traceback.") from exc

    guard.tools.add(name)
    metadata = FuncMetadata(arg_model=_RawArguments, output_schema=output_schema(result_schema))
    return Tool(fn=tool, name=name, title=title, description=description, parameters=catalog.input_schema(name),
                fn_metadata=metadata, is_async=True, context_kwarg="ctx", annotations=hints)


def pre_parse(model: type[BaseModel], arguments: Mapping[str, Any]) -> dict[str, Any]:
    """Arguments sent as JSON text where the field takes an object or a list (some clients stringify them)."""
    out = dict(arguments)
    structured_only = _structured_fields(model)
    for key, value in arguments.items():
        if key not in structured_only or not isinstance(value, str) or not value.lstrip().startswith(("{", "[")):
            continue
        try:
            parsed = json.loads(value)
        except (ValueError, RecursionError):
            continue
        if isinstance(parsed, dict | list):
            out[key] = parsed
    return out


@lru_cache(maxsize=64)
def _structured_fields(model: type[BaseModel]) -> frozenset[str]:
    """Fields whose schema takes an object or an array and never a string."""
    def types(node: dict[str, Any]) -> set[str]:
        found = {node["type"]} if isinstance(node.get("type"), str) else set(node.get("type") or [])
        for arm in node.get("anyOf", []) + node.get("oneOf", []):
            found |= types(arm)
        return found

    props = model.model_json_schema().get("properties", {})
    return frozenset(k for k, v in props.items() if types(v) & {"object", "array"} and "string" not in types(v))


@lru_cache(maxsize=64)
def published_arguments(model: type[BaseModel]) -> tuple[str, ...]:
    """The argument names the input schema shows (older spellings a model still reads are left out)."""
    return tuple(model.model_json_schema().get("properties", {}))


class ArgumentGuard:
    """Server middleware: validates ``tools/call`` and ``prompts/get`` arguments against their models first.

    A bad tool call is answered with an ``isError`` result (the model reads it and retries); an unknown
    prompt or a bad prompt argument is a JSON-RPC error -32602 (invalid params), as the spec asks.
    """

    def __init__(self) -> None:
        self.tools: set[str] = set()  # their input models: catalog.model(name), imported on first use
        self.prompts: dict[str, type[BaseModel]] = {}

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        if ctx.method == "tools/call" and isinstance(ctx.params, Mapping):
            name = ctx.params.get("name")
            if isinstance(name, str) and name in self.tools:
                model = catalog.model(name)
                arguments = ctx.params.get("arguments") or {}
                message = argument_problems(name, model, arguments)
                if message is not None:
                    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
        elif ctx.method == "prompts/get" and isinstance(ctx.params, Mapping):
            self._check_prompt(ctx.params.get("name"), ctx.params.get("arguments") or {})
        return await call_next(ctx)

    def _check_prompt(self, name: Any, arguments: Any) -> None:
        if name not in self.prompts:
            raise MCPError(code=INVALID_PARAMS, message=f"unknown prompt {name!r}. Fix: use one of "
                                                        f"{', '.join(self.prompts) or 'none'} (prompts/list).")
        message = argument_problems(name, self.prompts[name], arguments, what="prompt")
        if message is not None:
            raise MCPError(code=INVALID_PARAMS, message=message)


def argument_problems(tool: str, model: type[BaseModel], arguments: Any, *, what: str = "tool") -> str | None:
    """None when `arguments` fit `model`, else one message listing every problem with its fix."""
    if not isinstance(arguments, Mapping):
        return f"Invalid arguments for {what} `{tool}`: expected a JSON object. Fix: send named arguments."
    lines = []
    accepted = published_arguments(model)
    for key in arguments:
        if key not in model.model_fields:
            lines.append(f"- `{key}`: unknown argument. Fix: remove it; `{tool}` accepts: {', '.join(accepted)}.")
    try:
        model.model_validate(pre_parse(model, arguments))
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "extra_forbidden":
                continue  # reported above with the list of accepted names
            lines.append("- " + _describe(model, err))
    if not lines:
        return None
    return f"Invalid arguments for {what} `{tool}`:\n" + "\n".join(lines)


def _describe(model: type[BaseModel], err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err["loc"]) or "(arguments)"
    top = err["loc"][0] if err["loc"] else None
    field = model.model_fields.get(top) if isinstance(top, str) else None
    what = (field.description or "").rstrip(".") if field else ""
    if err["type"] == "missing":
        return f"`{loc}`: required. Fix: add `{loc}` ({what})." if what else f"`{loc}`: required. Fix: add it."
    msg = err["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if not err["loc"]:  # a rule across arguments: its message already says what to give
        return f"`{loc}`: {msg}. Fix: send the arguments as the message says."
    got = _shown(err.get("input"))
    if len(got) > 80:
        got = got[:77] + "..."
    fix = f"Fix: `{loc}` expects {what}." if what else "Fix: correct the value."
    return f"`{loc}`: {msg} (got {got}). {fix}"


def _shown(value: Any) -> str:
    """repr of a rejected value, never failing (an int over 4300 digits has no repr) and never long."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of about {int(value.bit_length() * 0.30103)} digits"
    try:
        return repr(value)
    except (ValueError, RecursionError):
        return f"a {type(value).__name__}"
