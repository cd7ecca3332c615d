"""validate_parsed: run every rule of the selected Megatron-Core rule set on a parsed config, report findings;
validate_config: parse a config source, then validate_parsed."""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from moe_overlap.skill.config.model import OverlapConfig, effective_values, parse_config
from moe_overlap.skill.rules import sources
from moe_overlap.skill.rules.base import Ctx, Rule, Unchecked
from moe_overlap.skill.rules.environment import Environment, detect_environment
from moe_overlap.skill.rules.notes import ResultNote, notes_for
from moe_overlap.skill.rules.registry import rules_for
from moe_overlap.skill.rules.versions import select_core


class Finding(BaseModel):
    rule: str = Field(description="card constraint id, or config:<kind> for a parser note")
    severity: Literal["error", "warning", "info"]
    path: str = Field(description="dotted config path to edit")
    message: str
    fix: str | None = None
    source: str | None = None


class RuleSet(BaseModel):
    name: str = Field(description='e.g. "megatron-core 0.16"')
    megatron_core_version: str | None = Field(None, description="the version asked for, implied or found")
    selected_by: Literal["given", "implied", "default"] = Field(description=(
        "given: --megatron-core-version; implied: a Megatron-Bridge config runs on its Bridge's Core release; "
        "default: the newest known release, none given or implied (the note names what is installed here)"))
    reason: str = Field("", description="why this release's rules were used, in words")
    flavour: Literal["megatron-bridge", "megatron-lm"] = Field("megatron-bridge", description=(
        "who reads the config: megatron-lm (argv: Core + Megatron-LM argument checks) or megatron-bridge "
        "(a ConfigContainer: Core + Bridge checks)"))
    note: str | None = None
    core_rules: list[str] = Field(description="rules Megatron-Core's TransformerConfig checks in this release")
    runtime_rules: list[str] = Field(default_factory=list, description=(
        "rules Megatron-Core or Megatron-LM enforce outside TransformerConfig in this release (model build, "
        "first step, Megatron-LM argument checks)"))
    bridge_rules: list[str] = Field(description="rules added from Megatron-Bridge's checks (run before Core)")
    advice_rules: list[str] = Field(description="warnings no library raises")


class ValidationResult(BaseModel):
    """Outcome of validating one EP-overlap config. `valid` is false when any finding is an error."""

    valid: bool
    findings: list[Finding]
    environment: Environment
    rule_set: RuleSet
    notes: list[ResultNote] = Field(default_factory=list, description=(
        "what matters next for a VALID overlap config (memory, micro-batches, CUDA_DEVICE_MAX_CONNECTIONS, eval "
        "steps, delayed wgrad, what to verify), each with its rule or source; empty otherwise"))


def _show(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(map(str, value)) + "]"
    return str(value)


def _run(rule: Rule, ctx: Ctx) -> Finding | None:
    outcome = rule.check(ctx)
    if outcome is None:
        return None
    if isinstance(outcome, Unchecked):
        return Finding(rule=rule.id, severity="warning", path=rule.path(ctx),
                       message=f"could not be checked: {outcome.reason}", fix=rule.fix, source=rule.source)
    shown = {k: _show(v) for k, v in ctx.values.items()} | {k: _show(v) for k, v in outcome.items()}
    return Finding(rule=rule.id, severity=rule.severity, path=rule.path(ctx), message=rule.message.format(**shown),
                   fix=rule.fix, source=rule.source)


# Fields (or values) that exist only in some releases: (first, last) release line, None = open.
_RELEASE_FIELDS: dict[tuple[str, object], tuple[tuple[int, int] | None, tuple[int, int] | None]] = {
    ("moe_use_legacy_grouped_gemm", True): (None, (0, 16)),
    ("overlap_dispatch_backward_with_experts_wgrad", True): ((0, 18), None),
    ("cuda_graph_impl", "full_iteration"): ((0, 18), None),
}


def _release_field_notes(cfg, line) -> list[Finding]:
    """A field set that the selected release does not have: its TransformerConfig would not accept it."""
    out = []
    for (name, value), (first, last) in _RELEASE_FIELDS.items():
        if name not in cfg.model.model_fields_set or getattr(cfg.model, name) != value:
            continue
        if (first and line < first) or (last and line > last):
            span = (f"from megatron-core {first[0]}.{first[1]}" if first else f"up to megatron-core {last[0]}.{last[1]}")
            out.append(Finding(rule="config:field-not-in-release", severity="warning", path=f"model.{name}",
                               message=f"model.{name}={_show(value)} exists only {span}; megatron-core "
                                       f"{line[0]}.{line[1]} does not know it",
                               fix=f"drop model.{name} for this release, or validate with the release you run "
                                   "(--megatron-core-version)"))
    return out


def _flag_release_notes(cfg, line) -> list[Finding]:
    """A Megatron-LM flag the selected release's parser does not have: pretrain_gpt.py would not start."""
    from moe_overlap.skill.config.argv import FLAG_RELEASES

    out = []
    for flag in dict.fromkeys(cfg._argv_flags):
        first, last = FLAG_RELEASES.get(flag, (None, None))
        if (first and line < first) or (last and line > last):
            span = ("in no release" if first and first[0] >= 99 else
                    f"from megatron-core {first[0]}.{first[1]}" if first else f"up to {last[0]}.{last[1]}")
            out.append(Finding(rule="config:flag-not-in-release", severity="error", path=flag, message=(
                f"Megatron-LM {line[0]}.{line[1]}'s parser has no {flag} (it exists {span}): pretrain_gpt.py stops "
                "with 'unrecognized arguments'"), fix=(
                "set VPP with --num-virtual-stages-per-pipeline-rank or --num-layers-per-virtual-pipeline-stage"
                if flag == "--virtual-pipeline-model-parallel-size" else
                f"drop {flag}, or validate with the release you run (--megatron-core-version)")))
    return out


def _rule_set_finding(selection) -> list[Finding]:
    if selection.note is None:
        return []
    if selection.warning:
        return [Finding(rule="rule-set:outside-known-releases", severity="warning", path="megatron_core_version",
                        message=selection.note, fix="validate with --megatron-core-version of a known release")]
    return [Finding(rule="rule-set:default", severity="info", path="megatron_core_version", message=selection.note)]


def _field_name_notes(cfg, line) -> list[Finding]:
    """The CUDA-graph scope field is `cuda_graph_scope` up to megatron-core 0.17, `cuda_graph_modules` from 0.18."""
    renamed = any(n.path == "model.cuda_graph_modules" for n in cfg.notes)
    if line >= (0, 18) and "cuda_graph_scope" in cfg.model.model_fields_set and not renamed:
        return [Finding(rule="config:renamed-field", severity="info", path="model.cuda_graph_scope",
                        message="megatron-core >= 0.18 calls this field cuda_graph_modules; both names are accepted "
                                "here, but the training script needs the name of its release",
                        fix="rename model.cuda_graph_scope to model.cuda_graph_modules for megatron-core >= 0.18")]
    if line < (0, 18) and renamed:
        return [Finding(rule="config:renamed-field", severity="info", path="model.cuda_graph_modules",
                        message="megatron-core <= 0.17 calls this field cuda_graph_scope",
                        fix="rename model.cuda_graph_modules to model.cuda_graph_scope for megatron-core <= 0.17")]
    return []


def validate_config(source: Any = None, *, overrides: Sequence[str] = (), argv: str | Sequence[str] | None = None,
                    torch_version: str | None = None, te_version: str | None = None, gpu: str | None = None,
                    megatron_core_version: str | None = None,
                    env: Mapping[str, str] | Environment | None = None, detect: bool = True,
                    flavour: Literal["megatron-bridge", "megatron-lm"] | None = None) -> ValidationResult:
    """Validate a config (dict, path, YAML text; plus Megatron-LM `argv` and dotted `overrides`): parse it, then
    validate_parsed.

    `env`: environment variables to read (default os.environ), or a ready Environment (then nothing is detected).
    `flavour`: who reads the config; default megatron-lm for `argv` alone, else megatron-bridge.
    Raises ConfigError on unreadable input.
    """
    return validate_parsed(parse_config(source, overrides, argv=argv), torch_version=torch_version,
                           te_version=te_version, gpu=gpu, megatron_core_version=megatron_core_version, env=env,
                           detect=detect, flavour=flavour)


def validate_parsed(cfg: OverlapConfig, *, torch_version: str | None = None, te_version: str | None = None,
                    gpu: str | None = None, megatron_core_version: str | None = None,
                    env: Mapping[str, str] | Environment | None = None, detect: bool = True,
                    flavour: Literal["megatron-bridge", "megatron-lm"] | None = None) -> ValidationResult:
    """Validate a config already parsed into the skill's model: nothing is read or parsed again, so a caller
    that holds the parse (a verification validating each of its modes) validates exactly what it parsed, the
    parser's notes included. Arguments as validate_config's; `flavour` defaults to megatron-lm for a config
    parsed from Megatron-LM argv alone, else megatron-bridge."""
    flavour = flavour or ("megatron-lm" if cfg._argv_only else "megatron-bridge")
    if isinstance(env, Environment):
        environment = env
    else:
        environment = detect_environment(torch_version=torch_version, te_version=te_version, gpu=gpu,
                                         env=env, detect=detect)
    implied = (sources.BRIDGE_CORE, sources.BRIDGE_CORE_PIN) if flavour == "megatron-bridge" else None
    selection = select_core(megatron_core_version, implied=implied)
    values, paths = effective_values(cfg)
    ctx = Ctx(values=values, paths=paths, env=environment, core=selection.line, flavour=flavour)
    rules = tuple(r for r in rules_for(selection.line) if r.for_flavour(flavour, selection.line))
    findings = [f for rule in rules if (f := _run(rule, ctx)) is not None]
    severity = {"wrong-section": "warning", "layer-split": "error"}
    findings += [Finding(rule=f"config:{n.kind}", severity=severity.get(n.kind, "info"), path=n.path,
                         message=n.message) for n in cfg.notes]
    findings += _field_name_notes(cfg, selection.line) + _release_field_notes(cfg, selection.line)
    if flavour == "megatron-lm":
        findings += _flag_release_notes(cfg, selection.line)
    findings += _rule_set_finding(selection)
    order = {"error": 0, "warning": 1, "info": 2}
    findings.sort(key=lambda f: order[f.severity])
    rule_set = RuleSet(
        name=selection.name, megatron_core_version=selection.requested, selected_by=selection.source,
        reason=selection.reason, flavour=flavour, note=selection.note,
        core_rules=[r.id for r in rules if r.kind(selection.line) == "core"],
        runtime_rules=[r.id for r in rules if r.kind(selection.line) == "runtime"],
        bridge_rules=[r.id for r in rules if r.kind(selection.line) == "bridge"],
        advice_rules=[r.id for r in rules if r.kind(selection.line) == "advice"],
    )
    valid = not any(f.severity == "error" for f in findings)
    return ValidationResult(valid=valid, findings=findings, environment=environment, rule_set=rule_set,
                            notes=notes_for(ctx) if valid and ctx.overlap else [])


_FLAVOUR_TEXT = {"megatron-lm": "Megatron-LM argv: Core + Megatron-LM argument checks",
                 "megatron-bridge": "Megatron-Bridge config: Core + Bridge checks"}


def _wrap(text: str, first: str, rest: str | None = None) -> str:
    return textwrap.fill(text, width=100, initial_indent=first, subsequent_indent=rest or first,
                         break_on_hyphens=False, break_long_words=False)


def render_text(result: ValidationResult, name: str = "config") -> str:
    """A terminal report: verdict, then one block per finding (errors first)."""
    env = result.environment
    counts = {s: sum(f.severity == s for f in result.findings) for s in ("error", "warning", "info")}
    verdict = "VALID" if result.valid else "INVALID"
    lines = [f"{name}: {verdict} ({counts['error']} error(s), {counts['warning']} warning(s), "
             f"{counts['info']} note(s))",
             f"rule set: {result.rule_set.name} for a {_FLAVOUR_TEXT[result.rule_set.flavour]} (release "
             f"{result.rule_set.reason or result.rule_set.selected_by})",
             f"environment: torch {env.torch_version or '?'} ({env.torch_version_source}), "
             f"TE {env.te_version or '?'} ({env.te_version_source}), "
             f"GPU {env.gpu_name or env.compute_capability or '?'} ({env.gpu_source}), "
             f"CUDA_DEVICE_MAX_CONNECTIONS={env.cuda_device_max_connections or 'unset'}"]
    for f in result.findings:
        lines.append("")
        lines.append(f"{f.severity.upper():7} [{f.rule}] {f.path}")
        lines.append(_wrap(f.message, "        "))
        if f.fix:
            lines.append(_wrap(f"fix: {f.fix}", "        ", "             "))
    if result.notes:
        lines += ["", "what matters next:"]
        lines += [_wrap(f"- {n.text} [{n.source}]", "  ", "    ") for n in result.notes]
    return "\n".join(lines) + "\n"
