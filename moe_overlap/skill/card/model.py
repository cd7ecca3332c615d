"""The skill card (`skills/<name>/card.yaml`) as a pydantic model.

`schemas/card.schema.json` is generated from `Card` (``python tools/gen_schemas.py``). Every model forbids
unknown keys, so a typo in the card is an error rather than silently ignored data.
Cross-references the JSON Schema cannot express (rule ids in failure modes exist as constraints,
sources name an evidence entry, ids are unique) are checked by `consistency_problems`.
Torch-free.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

KEBAB = r"^[a-z0-9]+(-[a-z0-9]+)*$"
VERSION = r"^[0-9]+(\.[0-9]+){0,2}$"

Confidence = Literal["low", "medium", "high"]
Severity = Literal["error", "warning"]
Checker = Literal["megatron-core", "megatron-lm", "megatron-bridge", "moe-overlap"]
ConstraintFamily = Literal[
    "parallelism", "dispatcher", "precision", "versions", "pipeline", "recompute", "shared-expert", "mtp",
    "cuda-graph", "offloading", "delayed-wgrad", "flex", "runtime",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class References(_Strict):
    skill_md: str = Field(description="path of SKILL.md, relative to the skill folder")
    docs: str = Field(description="the stable reference doc, relative to the skill folder (references/...)")
    schema_file: str = Field(description=(
        "the JSON Schema this card validates against: a file of the moe-overlap package (schemas/...), "
        "not of the skill folder"))


class ValidatedOn(_Strict):
    scope: str = Field(description="what was validated (config rules, numerics, performance)")
    environment: str
    versions: dict[str, str] = Field(default_factory=dict)
    date: str = Field(pattern=r"^\d{4}-\d{2}-\d{2}$")
    reproduce: str | None = Field(default=None, description="command that reproduces the validation")


class ValidationStatus(_Strict):
    level: Literal["unvalidated", "config-rules-checked", "numerics-verified", "performance-measured"]
    detail: str


class Dimension(_Strict):
    effect: Literal["improves", "neutral", "degrades", "mixed", "depends"]
    confidence: Confidence
    rationale: str


class TrainingDimensions(_Strict):
    speed: Dimension
    memory: Dimension
    scale: Dimension
    convergence: Dimension
    stability: Dimension


class AvoidWhen(_Strict):
    condition: str
    reason: str
    rule_ids: list[str] = Field(default_factory=list)


class Interaction(_Strict):
    feature: str
    relation: Literal["excludes", "requires", "constrains", "complements", "compatible"]
    detail: str
    rule_ids: list[str] = Field(default_factory=list)


class FeatureMeaning(_Strict):
    what_it_does: str
    how_it_works: list[str] = Field(min_length=1)
    what_it_does_not_do: list[str] = Field(default_factory=list)


class ConfigKey(_Strict):
    key: str = Field(description="Megatron-Bridge ConfigContainer path (section.field)")
    megatron_lm_flag: str | None = None
    type: str
    default: Any = None
    role: str


class PathStep(_Strict):
    stage: int = Field(ge=1)
    name: str = Field(pattern=KEBAB)
    change: str
    verify: str
    proceed_when: str


class MetricChange(_Strict):
    metric: str
    direction: Literal["increase", "decrease", "unchanged", "depends"]
    magnitude: str
    conditions: str
    evidence: Literal["measured", "not_yet_measured"]
    source: str = Field(description="an evidence id of this card")
    command: str | None = Field(default=None, description="command in this repository that reproduces it")


class MinimalExample(_Strict):
    description: str
    config: dict[str, dict[str, Any]] = Field(description="nested config, Megatron-Bridge section names")
    bridge_python: str
    megatron_lm_args: list[str]
    validate_command: str
    run_command: str
    upstream_command: str


class FailureMode(_Strict):
    name: str = Field(pattern=KEBAB)
    symptom: str
    likely_cause: str
    how_to_confirm: str
    fix: str
    rule_ids: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(
        default_factory=list,
        description=("word patterns matched against error text by `diagnose`, in time linear in the text: "
                     "space-separated words, `a|b` alternatives, `pre*` a prefix, `...` a gap of up to 12 words "
                     "(moe_overlap/skill/diagnose/textmatch.py)"),
    )


class Constraint(_Strict):
    id: str = Field(pattern=KEBAB)
    family: ConstraintFamily
    applies_when: str
    requires: str
    severity: Severity
    min_versions: dict[Literal["torch", "transformer_engine", "megatron_core"], str] = Field(default_factory=dict)
    checked_by: list[Checker] = Field(min_length=1)
    config_keys: list[str] = Field(default_factory=list)
    message: str
    fix: str
    source: list[str] = Field(min_length=1, description="evidence ids of this card")
    releases: str | None = Field(default=None, description=(
        "megatron-core release lines the rule holds for, e.g. 0.16-0.19 (the validator's rule set)"))
    upstream: str | None = Field(default=None, description=(
        "where upstream enforces it, file:line per release; left out when a rule of the validator has the same id "
        "(its source is the one record: references/upstream-lines.md is generated from it)"))
    notes: str | None = None


class CommandRef(_Strict):
    purpose: str
    cli: str | None = None
    mcp_tool: str | None = None
    upstream: str | None = None


class CodeAnchor(_Strict):
    repo: str
    path: str
    symbol: str
    what: str


class Limitation(_Strict):
    text: str
    source: list[str] = Field(default_factory=list)


class Evidence(_Strict):
    id: str = Field(pattern=KEBAB)
    kind: Literal["code", "docs", "paper", "pull-request", "measurement", "test"]
    title: str
    where: str = Field(description="URL, or repository + path")
    note: str | None = None


class Card(_Strict):
    """A skill card: everything an assistant needs to apply the feature safely."""

    name: str = Field(pattern=KEBAB, max_length=64)
    title: str
    card_version: str = Field(pattern=VERSION)
    summary: str
    references: References
    validated_on: list[ValidatedOn] = Field(min_length=1)
    validation_status: ValidationStatus
    training_dimensions: TrainingDimensions
    enable_when: list[str] = Field(min_length=1)
    prefer: list[str] = Field(default_factory=list)
    avoid_when: list[AvoidWhen] = Field(min_length=1)
    interactions: list[Interaction] = Field(default_factory=list)
    feature_meaning: FeatureMeaning
    config_keys: list[ConfigKey] = Field(min_length=1)
    recommended_path: list[PathStep] = Field(min_length=1)
    expected_metric_change: list[MetricChange] = Field(min_length=1)
    minimal_example: MinimalExample
    commands: list[CommandRef] = Field(default_factory=list)
    failure_modes: list[FailureMode] = Field(min_length=1)
    constraints: list[Constraint] = Field(min_length=1)
    code_anchors: list[CodeAnchor] = Field(default_factory=list)
    known_limitations: list[Limitation] = Field(min_length=1)
    evidence: list[Evidence] = Field(min_length=1)

    def constraint_ids(self) -> list[str]:
        return [c.id for c in self.constraints]

    def constraint(self, rule_id: str) -> Constraint:
        for c in self.constraints:
            if c.id == rule_id:
                return c
        raise KeyError(rule_id)


def _duplicates(values: list[str]) -> list[str]:
    seen: set[str] = set()
    return sorted({v for v in values if v in seen or seen.add(v)})


def consistency_problems(card: Card) -> list[tuple[tuple[str | int, ...], str]]:
    """Cross-references the schema cannot express, as (JSON path, message) pairs; empty when consistent."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    rule_ids = set(card.constraint_ids())
    evidence_ids = {e.id for e in card.evidence}
    for field, ids in (("constraints", card.constraint_ids()), ("evidence", [e.id for e in card.evidence]),
                       ("failure_modes", [f.name for f in card.failure_modes])):
        for dup in _duplicates(ids):
            problems.append(((field,), f"duplicate id {dup!r}"))

    def check_rules(path: tuple[str | int, ...], ids: list[str]) -> None:
        for j, rid in enumerate(ids):
            if rid not in rule_ids:
                problems.append(((*path, "rule_ids", j), f"unknown rule id {rid!r} (not in constraints)"))

    def check_sources(path: tuple[str | int, ...], ids: list[str]) -> None:
        for j, sid in enumerate(ids):
            if sid not in evidence_ids:
                problems.append(((*path, j), f"unknown evidence id {sid!r} (not in evidence)"))

    for i, f in enumerate(card.failure_modes):
        check_rules(("failure_modes", i), f.rule_ids)
    for i, a in enumerate(card.avoid_when):
        check_rules(("avoid_when", i), a.rule_ids)
    for i, x in enumerate(card.interactions):
        check_rules(("interactions", i), x.rule_ids)
    for i, c in enumerate(card.constraints):
        check_sources(("constraints", i, "source"), c.source)
    for i, m in enumerate(card.expected_metric_change):
        if m.source not in evidence_ids:
            problems.append((("expected_metric_change", i, "source"), f"unknown evidence id {m.source!r}"))
    for i, lim in enumerate(card.known_limitations):
        check_sources(("known_limitations", i, "source"), lim.source)
    return problems
