"""The knowledge tools: list_skills, get_skill_card, validate_config, generate_config, check_training_log,
diagnose_failure, estimate_overlap_benefit. Thin: arguments in, one `skill/` call, result out.

`skill/` modules are imported inside the handlers (start-up stays fast), except the two request models
used as input schemas. Every anticipated error becomes a ToolError naming the field and the fix.
Torch-free.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import Field, create_model

from moe_overlap.mcp import inputs as ins
from moe_overlap.mcp import safety
from moe_overlap.mcp.results import CardField, SkillInfo, SkillList, Truncation
from moe_overlap.mcp.safety import AllowedRoots, read_text_fd
from moe_overlap.mcp.toolkit import ArgumentGuard, add_model_tool, annotations
from moe_overlap.mcp.work import bounded
from moe_overlap.skill.card.schemas import resolve

logger = logging.getLogger(__name__)
READ_ONLY = dict(read_only=True, destructive=False, idempotent=True, open_world=False)
# Fields of skill/ request models that carry no description of their own.
EXTRA_DESCRIPTIONS = {
    "precision": "training precision: bf16, fp16 or fp32 (sets the bytes per element sent)",
    "calibration": "numbers measured on this machine by `moe_overlap.verify.calibrate` (optional)",
}


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
    if inp.config is not None:
        return inp.config
    if inp.config_path is not None:
        return read_config_path(inp.config_path, roots)
    if inp.config_text is not None:
        from moe_overlap.skill.config.load import ConfigError, parse_text

        try:
            return parse_text(inp.config_text, name="config_text")
        except ConfigError as exc:
            raise as_tool_error(exc, "config_text") from None
    return None


def read_config_path(raw: str, roots: AllowedRoots) -> dict[str, Any]:
    """The config file at `raw` under the allowed folders, opened once and parsed from that descriptor."""
    from moe_overlap.skill.config.load import MAX_BYTES, ConfigError, parse_file_bytes
    from moe_overlap.skill.config.model import looks_like_config
    from moe_overlap.skill.files import FileRefused, read_limited_fd

    fd, real = roots.open_file(raw, field="config_path")
    try:
        data = read_limited_fd(fd, MAX_BYTES, name=raw, what="config file")
    except FileRefused as exc:
        raise as_tool_error(ConfigError(exc.message, fix=exc.fix), "config_path") from None
    finally:
        os.close(fd)
    try:
        return parse_file_bytes(data, name=raw, suffix=real.suffix, recognised=looks_like_config)
    except ConfigError as exc:
        raise as_tool_error(exc, "config_path") from None


def register(server: MCPServer, guard: ArgumentGuard, roots: AllowedRoots) -> None:
    async def list_skills(inp: ins.ListSkillsInput, ctx: Context) -> SkillList:
        from moe_overlap.skill.card import cards

        try:
            found = await bounded(cards.list_skills, what="list_skills")
        except cards.CardError as exc:
            raise as_tool_error(exc, "card") from None
        return SkillList(skills=[SkillInfo(
            name=s.name, title=s.title, summary=s.summary, description=s.description,
            validation_status=s.validation_status, skill_uri=f"skill://{s.name}/SKILL.md",
            card_uri=f"skill://{s.name}/card.yaml") for s in found])

    async def get_skill_card(inp: ins.GetSkillCardInput, ctx: Context) -> CardField:
        from moe_overlap.skill.card import cards

        try:
            value = await bounded(cards.get_card_field, inp.name, inp.field, what="field")
        except cards.CardError as exc:
            field = "name" if inp.name not in cards.skill_names() else "field"
            raise as_tool_error(exc, field) from None
        return CardField(name=inp.name, field=inp.field, value=value)

    async def validate_config(inp: ins.ValidateConfigInput, ctx: Context) -> Any:
        from moe_overlap.skill.config.load import ConfigError
        from moe_overlap.skill.rules import validate

        def check():  # the source is read and parsed in the worker too: config_text may be large
            return validate.validate_config(
                config_source(inp, roots), overrides=tuple(inp.overrides), argv=inp.argv,
                torch_version=inp.torch_version, te_version=inp.te_version, gpu=inp.gpu,
                megatron_core_version=inp.megatron_core_version, env=inp.env)

        try:
            return await bounded(check, what="config")
        except (ConfigError, ValueError) as exc:
            raise as_tool_error(exc, "config") from None

    async def generate_config(inp: Any, ctx: Context) -> Any:
        from moe_overlap.skill.generate import api as generate

        try:
            return await bounded(generate.generate_config, inp, what="request")
        except ValueError as exc:
            raise as_tool_error(exc, "request") from None

    log_result: dict[str, Any] = {}  # the output model, built with the other models below

    async def check_training_log(inp: ins.CheckLogInput, ctx: Context) -> Any:
        from moe_overlap.skill.diagnose import logs

        text, source, cut = inp.text, "inline text", None
        if inp.path is not None:
            fd, path = roots.open_file(inp.path, field="path")
            try:
                text, omitted = await bounded(
                    lambda: read_text_fd(fd, max_bytes=safety.MAX_LOG_FILE_BYTES, name=path.name), what="path")
            finally:
                os.close(fd)
            source = str(path)
            if omitted:
                cut = Truncation(omitted=omitted, where=f"{path} (bytes between the head and the tail read)")
        try:
            result = await bounded(logs.check_training_log, text, what="text")
        except ValueError as exc:
            raise as_tool_error(exc, "text") from None
        return log_result["model"](**result.model_dump(), source=source, truncated=cut)

    async def diagnose_failure(inp: ins.DiagnoseInput, ctx: Context) -> Any:
        from moe_overlap.skill.diagnose import api as diagnose

        try:
            return await bounded(lambda: diagnose.diagnose(inp.text, limit=inp.limit), what="text")
        except ValueError as exc:
            raise as_tool_error(exc, "text") from None

    async def estimate_overlap_benefit(inp: Any, ctx: Context) -> Any:
        from moe_overlap.skill.estimate import api as estimate

        try:
            return await bounded(estimate.estimate_overlap_benefit, inp, what="request")
        except ValueError as exc:
            raise as_tool_error(exc, "request") from None

    # (tool, input model, result model, handler, title, description); "module:Name" models are the skill/
    # request and result models, imported here because the schemas are built at registration.
    specs = [
        ("list_skills", ins.ListSkillsInput, SkillList, list_skills, "List skills",
         "List the agent skills this server serves (name, summary, validation status, resource URIs)."),
        ("get_skill_card", ins.GetSkillCardInput, CardField, get_skill_card, "Read a skill card",
         "Return a skill card (constraints, failure modes, minimal example, evidence), whole or one dotted field."),
        ("validate_config", ins.ValidateConfigInput, "moe_overlap.skill.rules.validate:ValidationResult", validate_config,
         "Validate a config",
         "Check a training config (object, YAML/JSON text, Megatron-LM flags or a file) against every "
         "EP-overlap constraint; returns findings with rule id, path, message, fix and source. Versions not "
         "given are detected on the machine running this server (see `environment` in the result)."),
        ("generate_config", "moe_overlap.skill.generate.model:GenerateRequest", "moe_overlap.skill.generate.model:GenerateResult",
         generate_config, "Generate a config",
         "Generate a minimal working EP-overlap config (or a staged rollout) in the requested format; "
         "the result is validated before it is returned."),
        ("check_training_log", ins.CheckLogInput, "moe_overlap.skill.diagnose.logs:LogCheckResult", check_training_log,
         "Check a training log",
         "Read a training log (text, or a file under an allowed folder): effective overlap settings, "
         "warnings and failures, each with the rule or failure mode it matches."),
        ("diagnose_failure", ins.DiagnoseInput, "moe_overlap.skill.diagnose.api:DiagnosisResult", diagnose_failure,
         "Diagnose a failure",
         "Match an error message or symptom to the card's failure modes, ranked, with how to confirm, "
         "the fix and the rule ids."),
        ("estimate_overlap_benefit", "moe_overlap.skill.estimate.model:EstimateRequest",
         "moe_overlap.skill.estimate.model:EstimateResult", estimate_overlap_benefit, "Estimate the overlap gain",
         "Predict the step-time gain of EP communication overlap for a MoE shape, EP degree and fabric, "
         "with every assumption listed."),
    ]
    for name, model, result, handler, title, description in specs:
        try:
            model = resolve(model) if isinstance(model, str) else model
            result = resolve(result) if isinstance(result, str) else result
        except (ImportError, AttributeError) as exc:
            # A partial install or a checkout mid-change: serve the other tools, say which one is missing.
            logger.warning("tool %s not served: %s", name, exc)
            continue
        if name == "check_training_log":
            # The log checker's result plus where the text came from and what of a huge file was skipped.
            result = log_result["model"] = create_model(
                "LogCheckOutput", __base__=result,
                source=(str, Field(description="'inline text' or the file read")),
                truncated=(Truncation | None, Field(None, description="set when a large file was read in part")))
        add_model_tool(server, guard, name=name, input_model=model, result_model=result, handler=handler,
                       description=description, hints=annotations(title=title, **READ_ONLY),
                       descriptions=EXTRA_DESCRIPTIONS)
