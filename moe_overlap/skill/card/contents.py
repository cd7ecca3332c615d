"""Reading a card a piece at a time (its table of contents, one section, or one dotted field), and the skill list.

Why: a whole card is tens of thousands of characters, most of which an assistant does not need for the
question at hand. The contents list every section with its size and the ids of its entries, so the next
read can be exactly the piece needed. One model (`CardRead`) for the MCP tool `get_skill_card` and the
CLI's `moe-overlap card NAME --format json`; only `next_step` differs, naming the surface's own way
to read on. Torch-free.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, Field

from moe_overlap.skill.card.cards import CardError, get_card_field, list_skills, load_card

Surface = Literal["mcp", "cli"]


class SkillInfo(BaseModel):
    name: str
    title: str
    summary: str
    description: str
    validation_status: str
    skill_uri: str = Field(description="resources/read this URI (MCP) for SKILL.md")
    card_uri: str = Field(description="resources/read this URI (MCP) for card.yaml")


class SkillList(BaseModel):
    skills: list[SkillInfo]


def skill_list() -> SkillList:
    """The skills served: `list_skills` over MCP, `moe-overlap card --format json`."""
    return SkillList(skills=[SkillInfo(
        name=s.name, title=s.title, summary=s.summary, description=s.description,
        validation_status=s.validation_status, skill_uri=f"skill://{s.name}/SKILL.md",
        card_uri=f"skill://{s.name}/card.yaml") for s in list_skills()])


class SectionInfo(BaseModel):
    section: str
    chars: int = Field(description="size of the section as compact JSON")
    items: int | None = Field(None, description="entries in a list section")
    entries: list[str] | None = Field(None, description="ids / names of the entries (each readable as a field)")
    keys: list[str] | None = Field(None, description="keys of a mapping section")


class CardContents(BaseModel):
    title: str
    summary: str
    validation_status: str
    sections: list[SectionInfo]


class CardRead(BaseModel):
    """One read of a card: its contents (no section, no field), a section, or a field."""

    name: str = Field(description="the skill")
    section: str | None = None
    field: str | None = Field(None, description="the dotted path read")
    value: Any = Field(None, description="the section's or field's value as JSON data")
    contents: CardContents | None = Field(None, description="the table of contents (no section or field asked)")
    next_step: str


def _size(value: Any) -> int:
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False))


def _section_info(name: str, value: Any) -> SectionInfo:
    info = SectionInfo(section=name, chars=_size(value))
    if isinstance(value, list):
        info.items = len(value)
        ids = [str(e.get("id", e.get("name"))) for e in value if isinstance(e, dict)]
        if ids and "None" not in ids:
            info.entries = ids
    elif isinstance(value, dict):
        info.keys = list(value)
    return info


def card_contents(name: str) -> CardContents:
    card = load_card(name)
    data = card.model_dump(mode="json")
    return CardContents(title=card.title, summary=card.summary, validation_status=card.validation_status.level,
                        sections=[_section_info(k, v) for k, v in data.items()])


def _how(surface: Surface, name: str, **args: str) -> str:
    """How to make the next read on this surface: the MCP tool with its arguments, or the CLI command."""
    if surface == "mcp":
        given = ", ".join(f"{k}={v}" for k, v in args.items())
        return f"call get_skill_card with {given}" if given else "call get_skill_card with no arguments"
    return " ".join([f"run `moe-overlap card {name}", *(f"--{k} {v}" for k, v in args.items())]) + "`"


def read_card(name: str, section: str | None = None, field: str | None = None, *,
              surface: Surface = "mcp") -> CardRead:
    """The contents (neither given), a section, or a field (a dotted path, inside `section` when given).

    Raises CardError (unknown skill, section or field) with the valid choices.
    """
    if section is None and not field:
        contents = card_contents(name)
        keyed = next((s for s in contents.sections if s.entries), None)
        hint = f"for one section, {_how(surface, name, section='<section>')}"
        if keyed is not None:
            hint += f"; for one entry, {_how(surface, name, field=f'{keyed.section}.{keyed.entries[0]}')}"
        return CardRead(name=name, contents=contents, next_step=hint)
    if section is not None:
        sections = list(load_card(name).model_dump(mode="json"))
        if section not in sections:
            raise CardError(f"unknown section {section!r}", sections)
    path = ".".join(p for p in (section, field) if p)
    value = get_card_field(name, path)
    if isinstance(value, list | dict):
        hint = f"for one entry, {_how(surface, name, field=f'{path}.<id, name or index>')}"
    else:
        hint = f"for the card's contents, {_how(surface, name)}"
    return CardRead(name=name, section=section, field=field, value=value, next_step=hint)
