"""The skill's evaluation set (`skills/<name>/evals/evals.json`) as a pydantic model.

Shape follows the common Agent Skills evals layout (`skill_name`, `evals[]` with `id`, `prompt`,
`expected_output`, `files`, `expectations`) plus what this project needs to check coverage: the
ground truth, the topics and constraint families a question exercises, the rule ids it cites, and
`should_trigger` (false for the neighbouring questions the skill must not be used for), and the `source` of each
ground truth (upstream code, issue or pull request). evals/PROTOCOL.md says how they are run (tools/skill_eval.py).
`schemas/evals.schema.json` is generated from `EvalSet`. Torch-free.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from moe_overlap.skill.card.model import KEBAB, Card, ConstraintFamily

EvalTopic = Literal[
    "isolate-plain-overlap", "constraint-family", "flex-activation", "versions", "when-not-to-use",
    "failure-reading", "mechanism", "measurement", "out-of-scope",
]
REQUIRED_TOPICS: tuple[str, ...] = (
    "isolate-plain-overlap", "constraint-family", "flex-activation", "versions", "when-not-to-use",
    "failure-reading", "out-of-scope",
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class EvalCase(_Strict):
    id: int = Field(ge=1)
    name: str = Field(pattern=KEBAB)
    prompt: str = Field(description="what the user asks the assistant")
    ground_truth: str = Field(description="the correct answer, in a few sentences")
    expected_output: str = Field(description="how a good assistant behaves when answering")
    expectations: list[str] = Field(min_length=1, description="checkable statements a grader verifies")
    files: list[str] = Field(default_factory=list, description="input files, relative to the skill folder")
    topics: list[EvalTopic] = Field(min_length=1)
    families: list[ConstraintFamily] = Field(default_factory=list)
    rule_ids: list[str] = Field(default_factory=list, description="constraint ids the answer relies on")
    source: str = Field(min_length=10, description=(
        "where the ground truth comes from: upstream repository, file and line (or issue / pull request)"))
    should_trigger: bool = Field(True, description=(
        "whether an assistant should load this skill for the prompt; false: a neighbouring topic the skill must "
        "not pull the answer into (its expectations check that the answer stays out of EP-overlap advice)"))


class EvalSet(_Strict):
    skill_name: str = Field(pattern=KEBAB)
    evals: list[EvalCase] = Field(min_length=10)


def consistency_problems(evals: EvalSet, card: Card | None = None) -> list[tuple[tuple[str | int, ...], str]]:
    """Unique ids and names; with a card, every cited rule id exists and the skill names agree."""
    problems: list[tuple[tuple[str | int, ...], str]] = []
    seen_ids: set[int] = set()
    seen_names: set[str] = set()
    for i, case in enumerate(evals.evals):
        if case.id in seen_ids:
            problems.append((("evals", i, "id"), f"duplicate id {case.id}"))
        if case.name in seen_names:
            problems.append((("evals", i, "name"), f"duplicate name {case.name!r}"))
        seen_ids.add(case.id)
        seen_names.add(case.name)
    if card is not None:
        if evals.skill_name != card.name:
            problems.append((("skill_name",), f"{evals.skill_name!r} != card name {card.name!r}"))
        known = set(card.constraint_ids())
        for i, case in enumerate(evals.evals):
            for j, rid in enumerate(case.rule_ids):
                if rid not in known:
                    problems.append((("evals", i, "rule_ids", j), f"unknown rule id {rid!r}"))
    return problems
