"""Skill cards: list the skills, load a card (validated), read one field of it, load its evals.

Data is found through `moe_overlap.paths`, so this works the same from a checkout and from an installed
wheel. A malformed card raises `CardFileError` whose problems name file, line and JSON path; an unknown
skill name or field path raises `CardError` with the valid choices. Torch-free.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from moe_overlap.paths import skills_dir
from moe_overlap.skill.card import evals as evals_model
from moe_overlap.skill.card import model as card_model
from moe_overlap.skill.card.docfile import DocumentError, Problem, load_model
from moe_overlap.skill.card.evals import EvalSet
from moe_overlap.skill.card.model import Card

DEFAULT_SKILL = "perf-expert-parallel-overlap"
CARD_FILE = "card.yaml"
SKILL_FILE = "SKILL.md"
EVALS_FILE = "evals/evals.json"


class CardError(LookupError):
    """Unknown skill or field; `choices` lists what is valid at that point."""

    def __init__(self, message: str, choices: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.choices = list(choices or [])


class CardFileError(CardError):
    """A card or evals file that does not parse or validate; `problems` carry file, line, JSON path."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        super().__init__(str(DocumentError(problems)))


class SkillSummary(BaseModel):
    name: str
    title: str
    summary: str
    description: str
    validation_status: str
    path: str


def skill_names() -> list[str]:
    root = skills_dir()
    return sorted(p.name for p in root.iterdir() if (p / SKILL_FILE).is_file() or (p / CARD_FILE).is_file())


def skill_dir(name: str) -> Path:
    names = skill_names()
    if name not in names:
        raise CardError(f"unknown skill {name!r}", names)
    return skills_dir() / name


def read_frontmatter(skill_md: Path) -> dict[str, Any]:
    """The YAML frontmatter of a SKILL.md (between the first two `---` lines); {} when absent."""
    text = skill_md.read_text(encoding="utf-8")
    if not text.startswith("---"):
        return {}
    _, _, rest = text.partition("\n")
    head, sep, _ = rest.partition("\n---")
    return (yaml.safe_load(head) or {}) if sep else {}


def _card_schema() -> dict | None:
    from moe_overlap.skill.card.schemas import load_schema

    try:
        return load_schema("card.schema.json")
    except FileNotFoundError:  # schema not generated yet: the pydantic model still validates
        return None


@lru_cache(maxsize=16)
def _load_card_cached(path: str, mtime_ns: int) -> Card:
    try:
        return load_model(Path(path), Card, schema=_card_schema(), extra_checks=card_model.consistency_problems)
    except DocumentError as exc:
        raise CardFileError(exc.problems) from None


def card_path(name: str = DEFAULT_SKILL) -> Path:
    return skill_dir(name) / CARD_FILE


def load_card(name: str = DEFAULT_SKILL) -> Card:
    """The validated card of skill `name`."""
    path = card_path(name)
    if not path.is_file():
        raise CardError(f"skill {name!r} has no {CARD_FILE}", skill_names())
    return load_card_file(path)


def load_card_file(path: Path) -> Card:
    """Validate any card file (used by tests and by people editing a card)."""
    return _load_card_cached(str(path), path.stat().st_mtime_ns if path.exists() else 0)


def load_evals_file(path: Path, card: Card | None = None) -> EvalSet:
    from moe_overlap.skill.card.schemas import load_schema

    try:
        schema = load_schema("evals.schema.json")
    except FileNotFoundError:
        schema = None
    try:
        return load_model(path, EvalSet, schema=schema,
                          extra_checks=lambda ev: evals_model.consistency_problems(ev, card))
    except DocumentError as exc:
        raise CardFileError(exc.problems) from None


def load_evals(name: str = DEFAULT_SKILL) -> EvalSet:
    path = skill_dir(name) / EVALS_FILE
    if not path.is_file():
        raise CardError(f"skill {name!r} has no {EVALS_FILE}", skill_names())
    return load_evals_file(path, load_card(name))


def list_skills() -> list[SkillSummary]:
    out = []
    for name in skill_names():
        folder = skills_dir() / name
        front = read_frontmatter(folder / SKILL_FILE) if (folder / SKILL_FILE).is_file() else {}
        card = load_card(name) if (folder / CARD_FILE).is_file() else None
        out.append(SkillSummary(
            name=name,
            title=card.title if card else name,
            summary=card.summary if card else "",
            description=str(front.get("description", "")),
            validation_status=card.validation_status.level if card else "unvalidated",
            path=str(folder),
        ))
    return out


def _step(value: Any, part: str, walked: str) -> Any:
    where = walked or "the card"
    if isinstance(value, dict):
        if part in value:
            return value[part]
        raise CardError(f"unknown field {part!r} in {where}", sorted(value))
    if isinstance(value, list):
        if part.lstrip("-").isdigit():
            idx = int(part)
            if -len(value) <= idx < len(value):
                return value[idx]
            raise CardError(f"index {idx} out of range in {where} ({len(value)} items)",
                            [str(i) for i in range(len(value))])
        # Lists of entries are addressable by their id or name: constraints.ep-size-gt-1.requires
        keyed = {str(item.get("id", item.get("name"))): item for item in value if isinstance(item, dict)}
        if part in keyed:
            return keyed[part]
        raise CardError(f"no entry {part!r} in {where}",
                        [k for k in keyed if k != "None"] or [str(i) for i in range(len(value))])
    raise CardError(f"{where} is a scalar; it has no field {part!r}", [])


def get_card_field(name: str, dotted_path: str | None) -> Any:
    """One field of the card as plain JSON data. `dotted_path` like "constraints.ep-size-gt-1.requires";
    list items by index or by their `id` / `name`. Empty path: the whole card."""
    value: Any = load_card(name).model_dump(mode="json")
    walked = ""
    for part in [p for p in (dotted_path or "").split(".") if p]:
        value = _step(value, part, walked)
        walked = f"{walked}.{part}" if walked else part
    return value
