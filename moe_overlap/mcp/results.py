"""Result models of the MCP tools that wrap or bound a `skill/` / `verify/` result.

Bounded outputs: a verification report keeps at most `MAX_LIST_ITEMS` step records per mode and says
where the full report.json is. Torch-free.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from moe_overlap.mcp.safety import MAX_LIST_ITEMS


class SkillInfo(BaseModel):
    name: str
    title: str
    summary: str
    description: str
    validation_status: str
    skill_uri: str = Field(description="resources/read this URI for SKILL.md")
    card_uri: str = Field(description="resources/read this URI for card.yaml")


class SkillList(BaseModel):
    skills: list[SkillInfo]


class CardField(BaseModel):
    name: str = Field(description="the skill")
    field: str | None = Field(description="the dotted path read; null for the whole card")
    value: Any = Field(description="the card, or the field's value, as JSON data")


class Truncation(BaseModel):
    omitted: int = Field(description="items left out of this result")
    where: str = Field(description="where the full data is")


class VerificationStatus(BaseModel):
    job_id: str
    state: Literal["running", "succeeded", "failed", "cancelled"] = Field(
        description="succeeded means the run finished; read report.verdict for passed/failed")
    elapsed_s: float
    progress: dict[str, Any] = Field(default_factory=dict, description="the latest progress event")
    recent_progress: list[dict[str, Any]] = Field(default_factory=list, description="the last few progress events")
    summary: dict[str, Any] | None = Field(
        None, description="what to read first (verify/summary.py): verdict, headline, criteria, per-mode split of the "
                          "step time with predicted vs measured ratio, why, what would change it")
    report: dict[str, Any] | None = Field(
        None, description="the verification report (schemas/verification-report.schema.json), step lists bounded")
    error: str | None = None
    truncated: list[Truncation] = Field(default_factory=list)
    live_child_processes: list[int] | None = Field(
        None, description="processes this server still runs (only checked by cancel_verification); [] is clean")
    next_step: str = Field(description="what to do next")


def bounded_report(report: BaseModel) -> tuple[dict[str, Any], list[Truncation]]:
    """The report as JSON data with each mode's step records cut to the first and last few."""
    data = report.model_dump(mode="json")
    cuts: list[Truncation] = []
    where = f"{data.get('out_dir', '?')}/report.json"
    for run in data.get("runs", []):
        steps = run.get("steps", [])
        if len(steps) > MAX_LIST_ITEMS:
            half = MAX_LIST_ITEMS // 2
            run["steps"] = steps[:half] + steps[-half:]
            cuts.append(Truncation(omitted=len(steps) - 2 * half,
                                   where=f"{where} (runs[mode={run.get('mode')}].steps)"))
    failure = data.get("failure") or {}
    for key in ("traceback",):
        text = failure.get(key)
        if isinstance(text, str) and len(text) > 8000:
            failure[key] = "...\n" + text[-8000:]
            cuts.append(Truncation(omitted=len(text) - 8000, where=f"{where} (failure.{key}, characters)"))
    return data, cuts
