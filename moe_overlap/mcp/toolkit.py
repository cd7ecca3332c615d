"""Registering a tool from a pydantic input model, and argument errors a model can act on.

Each tool is declared as (input model, handler(inputs, ctx) -> result model). The SDK derives a tool's
input schema from the Python signature, so `add_model_tool` builds a wrapper whose signature lists
the input model's fields (descriptions and constraints included). Why not let the SDK validate alone:
its argument errors are raw pydantic dumps and it silently drops unknown arguments (a typo such as
``backgroud: true`` would be ignored). `ArgumentGuard` runs first, as server middleware, and answers a
bad ``tools/call`` with an ``isError`` result that names each field, what is wrong and the fix.
Torch-free.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import BaseModel, Field, ValidationError

logger = logging.getLogger(__name__)
Handler = Callable[[Any, Context], Awaitable[BaseModel]]


def annotations(*, read_only: bool, destructive: bool, idempotent: bool, open_world: bool,
                title: str) -> ToolAnnotations:
    """All four hints, always set explicitly (clients treat a missing hint as the unsafe default)."""
    return ToolAnnotations(title=title, readOnlyHint=read_only, destructiveHint=destructive,
                           idempotentHint=idempotent, openWorldHint=open_world)


def _signature(model: type[BaseModel], result: type[BaseModel],
               descriptions: dict[str, str]) -> inspect.Signature:
    params = []
    for name, field in model.model_fields.items():
        # Only the schema-visible parts of the field go into the SDK's argument model; the full
        # validation (validators included) is ArgumentGuard's and the handler's job.
        info = Field(description=field.description or descriptions.get(name), examples=field.examples,
                     json_schema_extra=field.json_schema_extra)
        annotation = Annotated[(field.annotation, *field.metadata, info)]
        default = inspect.Parameter.empty if field.is_required() else field.get_default(call_default_factory=True)
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                        annotation=annotation))
    params.append(inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=Context))
    return inspect.Signature(params, return_annotation=result)


class ArgumentGuard:
    """Server middleware: validates ``tools/call`` arguments against the tool's input model first."""

    def __init__(self) -> None:
        self.models: dict[str, type[BaseModel]] = {}

    async def __call__(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        if ctx.method == "tools/call" and isinstance(ctx.params, Mapping):
            name = ctx.params.get("name")
            model = self.models.get(name) if isinstance(name, str) else None
            if model is not None:
                arguments = ctx.params.get("arguments") or {}
                message = argument_problems(name, model, arguments)
                if message is not None:
                    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)
        return await call_next(ctx)


def argument_problems(tool: str, model: type[BaseModel], arguments: Any) -> str | None:
    """None when `arguments` fit `model`, else one message listing every problem with its fix."""
    if not isinstance(arguments, Mapping):
        return f"Invalid arguments for `{tool}`: expected a JSON object. Fix: send named arguments."
    lines = []
    accepted = list(model.model_fields)
    for key in arguments:
        if key not in model.model_fields:
            lines.append(f"- `{key}`: unknown argument. Fix: remove it; `{tool}` accepts: {', '.join(accepted)}.")
    try:
        model.model_validate(arguments)
    except ValidationError as exc:
        for err in exc.errors():
            if err["type"] == "extra_forbidden":
                continue  # reported above with the list of accepted names
            lines.append("- " + _describe(model, err))
    if not lines:
        return None
    return f"Invalid arguments for `{tool}`:\n" + "\n".join(lines)


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
    got = repr(err.get("input"))
    if len(got) > 80:
        got = got[:77] + "..."
    fix = f"Fix: `{loc}` expects {what}." if what else "Fix: correct the value."
    return f"`{loc}`: {msg} (got {got}). {fix}"


def add_model_tool(server: MCPServer, guard: ArgumentGuard, *, name: str, input_model: type[BaseModel],
                   result_model: type[BaseModel], handler: Handler, description: str,
                   hints: ToolAnnotations, descriptions: dict[str, str] | None = None) -> None:
    """Register `handler` as tool `name`, taking `input_model`'s fields as arguments.

    `descriptions`: for fields of a model owned elsewhere that lack one (every argument needs one).
    """

    async def tool(ctx: Context, **kwargs: Any) -> BaseModel:
        # Arguments already passed ArgumentGuard; validating again applies the model's validators and
        # defaults for calls made without the middleware (MCPServer.call_tool in tests).
        try:
            inputs = input_model.model_validate(kwargs)
        except ValidationError as exc:
            raise ToolError(argument_problems(name, input_model, kwargs) or str(exc)) from None
        try:
            return await handler(inputs, ctx)
        except ToolError:
            raise
        except Exception as exc:
            # A bug, not bad input: the traceback goes to stderr; the model still learns what failed
            # instead of the SDK's bare "Error executing tool".
            logger.exception("tool %s crashed", name)
            raise ToolError(f"internal error in `{name}`: {type(exc).__name__}: {exc}. This is a bug in "
                            "moe-overlap, not in your input; the server log (stderr) has the traceback.") from exc

    tool.__name__ = name
    tool.__doc__ = description
    tool.__signature__ = _signature(input_model, result_model, descriptions or {})  # type: ignore[attr-defined]
    tool.__annotations__ = {"ctx": Context, "return": result_model}
    guard.models[name] = input_model
    server.add_tool(tool, name=name, title=hints.title, description=description, annotations=hints,
                    structured_output=True)
