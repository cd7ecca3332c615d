"""The knowledge tools: list_skills, get_skill_card, validate_config, generate_config, check_training_log,
diagnose_failure, estimate_overlap_benefit. Thin: arguments in, one `skill/` call, result out.

`skill/` modules are imported inside the handlers (start-up stays fast), except the two request models
used as input schemas. Every anticipated error becomes a ToolError naming the field and the fix.
Torch-free.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool

from moe_overlap.mcp import safety
from moe_overlap.mcp.isolated import isolated
from moe_overlap.mcp.safety import AllowedRoots, read_text_fd
from moe_overlap.mcp.toolkit import READ_ONLY, ArgumentGuard, model_tool
from moe_overlap.mcp.work import bounded

if TYPE_CHECKING:  # the input models are imported on a tool's first call (catalog.py)
    from moe_overlap.mcp import inputs as ins

logger = logging.getLogger(__name__)


def _finite_estimate(estimate, request):
    """The estimate, or a ValueError when the inputs give no finite time: skill/estimate/api.py _recommend raises
    StopIteration on times that overflowed (a StopIteration crossing a coroutine would become RuntimeError)."""
    try:
        return estimate(request)
    except (StopIteration, ArithmeticError):
        raise ValueError("these inputs give no finite step time (a rate or share so small or large that the "
                         "predicted times overflow). Fix: give rates and efficiencies in a realistic range") from None


def as_tool_error(exc: Exception, default_field: str) -> ToolError:
    """A domain error (CardError, ConfigError, EstimateError, ValueError) as a ToolError with field and fix."""
    field = getattr(exc, "field", None) or default_field
    message = getattr(exc, "message", None) or str(exc)
    if message.startswith(f"{field}: "):  # EstimateError's str() already leads with the field
        message = message[len(field) + 2:]
    message = message.rstrip()
    parts = [f"`{field}`: {message}" + ("" if message.endswith((".", "!", "?")) else ".")]
    fix = getattr(exc, "fix", None)
    choices = getattr(exc, "choices", None)
    if fix:
        parts.append(f"Fix: {fix}.")
    if choices:
        shown = ", ".join(map(str, choices[:40])) + (" ..." if len(choices) > 40 else "")
        parts.append(f"Valid choices: {shown}.")
    if not fix and not choices:
        parts.append(f"Fix: correct `{field}` and call again.")
    return ToolError(" ".join(parts))


def config_source(inp: Any, roots: AllowedRoots) -> Any:
    """The config argument for validate/verify: a dict, or a Path checked against the allowed folders.

    Text is parsed here, never handed on as a string: the config loaders treat a one-line string as a
    file name, which would let a client read files outside the allowed folders.
    """
    given = inp.source()
    if given is None:
        return None
    kind, value = given
    field = "config" if getattr(inp, "config", None) is not None else f"config_{kind}"
    if kind == "object":
        return value
    if kind == "path":
        return read_config_path(value, roots, field=field)
    from moe_overlap.skill.config.load import ConfigError, parse_text

    try:
        return parse_text(value, name=field)
    except ConfigError as exc:
        raise as_tool_error(exc, field) from None


def read_config_path(raw: str, roots: AllowedRoots, *, field: str = "config") -> dict[str, Any]:
    """The config file at `raw` under the allowed folders, opened once and parsed from that descriptor."""
    from moe_overlap.skill.config.load import MAX_BYTES, ConfigError, parse_file_bytes
    from moe_overlap.skill.config.model import looks_like_config
    from moe_overlap.skill.files import FileRefused, read_limited_fd

    fd, real = roots.open_file(raw, field=field)
    try:
        data = read_limited_fd(fd, MAX_BYTES, name=raw, what="config file")
    except FileRefused as exc:
        raise as_tool_error(ConfigError(exc.message, fix=exc.fix), field) from None
    finally:
        os.close(fd)
    try:
        return parse_file_bytes(data, name=raw, suffix=real.suffix, recognised=looks_like_config)
    except ConfigError as exc:
        raise as_tool_error(exc, field) from None


def tools(guard: ArgumentGuard, roots: AllowedRoots) -> list[Tool]:
    """The seven knowledge tools, ready for MCPServer(tools=...)."""

    async def list_skills(inp: ins.ListSkillsInput, ctx: Context) -> Any:
        from moe_overlap.skill.card import cards, contents

        try:
            return await bounded(contents.skill_list, what="list_skills")
        except cards.CardError as exc:
            raise as_tool_error(exc, "card") from None

    async def get_skill_card(inp: ins.GetSkillCardInput, ctx: Context) -> Any:
        from moe_overlap.skill.card import cards, contents

        try:
            return await bounded(contents.read_card, inp.name, inp.section, inp.field, what="field")
        except cards.CardError as exc:
            raise as_tool_error(exc, "field" if inp.field else "section") from None

    async def validate_config(inp: ins.ValidateConfigInput, ctx: Context) -> Any:
        from moe_overlap.skill.config.load import ConfigError
        from moe_overlap.skill.rules import validate

        def check():  # the source is read and parsed in the worker too: config text may be large
            return validate.validate_config(
                config_source(inp, roots), overrides=tuple(inp.overrides), argv=inp.argv,
                torch_version=inp.torch_version, te_version=inp.te_version, gpu=inp.gpu,
                megatron_core_version=inp.megatron_core_version, env=inp.env)

        try:
            return await bounded(check, what="config")
        except (ConfigError, ValueError) as exc:
            raise as_tool_error(exc, "config") from None

    async def generate_config(inp: ins.GenerateInput, ctx: Context) -> Any:
        from moe_overlap.skill.generate import api as generate
        from moe_overlap.skill.generate.model import GenerateRequest

        request = GenerateRequest.model_validate(inp.model_dump(exclude_unset=True))
        try:
            return await bounded(generate.generate_config, request, what="request")
        except ValueError as exc:
            raise as_tool_error(exc, "request") from None

    async def check_training_log(inp: ins.CheckLogInput, ctx: Context) -> Any:
        from moe_overlap.skill.diagnose.log_output import log_output

        text, source, omitted = inp.text, "inline text", 0
        if inp.path is not None:
            fd, path = roots.open_file(inp.path, field="path")
            try:
                text, omitted = await bounded(
                    lambda: read_text_fd(fd, max_bytes=safety.MAX_LOG_FILE_BYTES, name=path.name), what="path")
            finally:
                os.close(fd)
            source = str(path)
        try:
            # In a worker process: regular expressions over a large text hold the interpreter lock (isolated.py).
            result = await isolated("moe_overlap.skill.diagnose.logs:check_training_log", text, what="text")
        except ValueError as exc:
            raise as_tool_error(exc, "text") from None
        return log_output(result, source=source, omitted=omitted)

    async def diagnose_failure(inp: ins.DiagnoseInput, ctx: Context) -> Any:
        try:
            return await isolated("moe_overlap.skill.diagnose.api:diagnose", inp.text, inp.limit, what="text")
        except ValueError as exc:
            raise as_tool_error(exc, "text") from None

    async def estimate_overlap_benefit(inp: ins.EstimateInput, ctx: Context) -> Any:
        from moe_overlap.skill.estimate import api as estimate
        from moe_overlap.skill.estimate.model import EstimateRequest

        request = EstimateRequest.model_validate(inp.model_dump(exclude_unset=True))
        try:
            return await bounded(_finite_estimate, estimate.estimate_overlap_benefit, request, what="request")
        except ValueError as exc:
            raise as_tool_error(exc, "request") from None

    # (name, title, description, handler, the result's schema under schemas/: its model is in
    # skill/card/schemas.py SCHEMA_MODELS, so no result model is imported at start-up)
    specs = [
        ("list_skills", "List skills", "The skills this server serves, with their resource URIs.",
         list_skills, "skill-list"),
        ("get_skill_card", "Read a skill card", "A skill card in pieces: no arguments give its contents (sections, "
         "sizes, entry ids); then one section or one dotted field.", get_skill_card, "card-read"),
        ("validate_config", "Validate a config", "Check a training config and/or Megatron-LM flags against every "
         "EP-overlap rule: findings with rule id, path, message and fix.",
         validate_config, "validation-result"),
        ("generate_config", "Generate a config", "A minimal working EP-overlap config, or the staged rollout "
         "(plan=true), validated.", generate_config, "generate-result"),
        ("check_training_log", "Check a training log", "Effective overlap settings, warnings and failures in a "
         "training log, each with its rule or failure mode.", check_training_log, "log-check-result"),
        ("diagnose_failure", "Diagnose a failure", "Match an error or symptom to known failure modes, ranked, "
         "with how to confirm and the fix.", diagnose_failure, "diagnosis-result"),
        ("estimate_overlap_benefit", "Estimate the overlap gain", "Predict the step-time gain of EP overlap per "
         "schedule for a MoE shape, EP size and fabric.", estimate_overlap_benefit,
         "estimate-result"),
    ]
    return [model_tool(guard, name=name, title=title, description=description, handler=handler, hints=READ_ONLY,
                       result_schema=result) for name, title, description, handler, result in specs]
