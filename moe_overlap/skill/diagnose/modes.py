"""The failure modes `diagnose` ranks: the card's (configuration assertions) plus the runtime and
dispatcher-backend ones of `references/runtime-failures.yaml`, merged into one compiled set.

The YAML file also says, for card modes, which patterns are generic and what context they need, and lists the
failures that are not EP-overlap failures (`not_ep_overlap`). Everything is validated when loaded: unknown keys,
patterns outside the word-pattern syntax (textmatch.py), overlays of modes the card does not have, and name
clashes are errors naming the file and the entry. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moe_overlap.skill.card.cards import DEFAULT_SKILL, load_card, skill_dir
from moe_overlap.skill.card.model import Card
from moe_overlap.skill.diagnose import textmatch

DATA_FILE = "references/runtime-failures.yaml"
Need = Literal["ep", "overlap"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class Context(_Strict):
    ep: list[str] = Field(min_length=1)
    overlap: list[str] = Field(min_length=1)
    overlap_generic: list[str] = Field(default_factory=list)
    other_overlap: list[str] = Field(default_factory=list)


class CardModeOverlay(_Strict):
    needs: Need | None = None
    typed_symptom: bool = Field(default=False, description=(
        "its generic patterns are symptom phrases a user types (hangs, no speedup): in a short text they count "
        "without context"))
    also_context: list[str] = Field(default_factory=list, description="more patterns that satisfy `needs`")
    generic: list[str] = Field(default_factory=list, description="those of the card's patterns that are generic")
    extra: list[str] = Field(default_factory=list, description="more specific patterns")
    sources: list[str] = Field(default_factory=list)


class RuntimeMode(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    symptom: str
    likely_cause: str
    how_to_confirm: str
    fix: str
    rule_ids: list[str] = Field(default_factory=list)
    patterns: list[str] = Field(min_length=1)
    generic: list[str] = Field(default_factory=list)
    needs: Need | None = None
    sources: list[str] = Field(min_length=1, description="the upstream threads this failure mode comes from")


class NotEpCategory(_Strict):
    id: str = Field(pattern=r"^[a-z0-9]+(-[a-z0-9]+)*$")
    patterns: list[str] = Field(min_length=1)
    what_to_do: str


class DiagnoseData(_Strict):
    context: Context
    card_modes: dict[str, CardModeOverlay] = Field(default_factory=dict)
    failure_modes: list[RuntimeMode] = Field(min_length=1)
    not_ep_overlap: list[NotEpCategory] = Field(min_length=1)


class DiagnoseDataError(ValueError):
    """The data file is malformed; the message names the file, the entry and the fix."""


@dataclass(frozen=True)
class Mode:
    name: str
    symptom: str
    likely_cause: str
    how_to_confirm: str
    fix: str
    rule_ids: tuple[str, ...]
    specific: tuple[int, ...]  # indexes into ModeSet.patterns
    generic: tuple[int, ...]
    needs: Need | None
    typed_symptom: bool
    also_context: tuple[int, ...]
    sources: tuple[str, ...]
    doc: str  # the text whose words are matched


@dataclass(frozen=True)
class ModeSet:
    modes: tuple[Mode, ...]
    categories: tuple[tuple[str, str, tuple[int, ...]], ...]  # (id, what_to_do, pattern indexes)
    ep: tuple[int, ...]
    overlap: tuple[int, ...]
    overlap_generic: tuple[int, ...]
    other_overlap: tuple[int, ...]
    matcher: textmatch.Matcher


class _Builder:
    def __init__(self, where: str):
        self.where = where
        self.patterns: list[textmatch.Pattern] = []
        self.index: dict[str, int] = {}

    def add(self, patterns: list[str], entry: str) -> tuple[int, ...]:
        ids = []
        for text in patterns:
            if text not in self.index:
                try:
                    self.patterns.append(textmatch.parse(text))
                except textmatch.PatternError as exc:
                    raise DiagnoseDataError(f"{self.where}: {entry}: {exc}") from None
                self.index[text] = len(self.patterns) - 1
            ids.append(self.index[text])
        return tuple(ids)


def _card_sources(card: Card, rule_ids: list[str]) -> list[str]:
    """Where the card's evidence behind a mode's rules lives (repository + path, or a URL)."""
    evidence = {e.id: e.where for e in card.evidence}
    out: list[str] = []
    for rid in rule_ids:
        if rid in card.constraint_ids():
            for sid in card.constraint(rid).source:
                if sid in evidence and evidence[sid] not in out:
                    out.append(evidence[sid])
    return out


def load_data(skill: str = DEFAULT_SKILL) -> DiagnoseData:
    path = skill_dir(skill) / DATA_FILE
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
        return DiagnoseData.model_validate(raw)
    except (OSError, yaml.YAMLError) as exc:
        raise DiagnoseDataError(f"{path}: cannot read: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise DiagnoseDataError(f"{path}: {loc}: {first['msg']}") from None


@lru_cache(maxsize=4)
def mode_set(skill: str = DEFAULT_SKILL) -> ModeSet:
    """The card's failure modes followed by the data file's, compiled once per skill."""
    card = load_card(skill)
    data = load_data(skill)
    where = str(skill_dir(skill) / DATA_FILE)
    b = _Builder(where)
    card_names = {fm.name for fm in card.failure_modes}
    unknown = sorted(set(data.card_modes) - card_names)
    if unknown:
        raise DiagnoseDataError(f"{where}: card_modes: {unknown} are not failure modes of the card "
                                f"(choices: {sorted(card_names)})")
    modes: list[Mode] = []
    for fm in card.failure_modes:
        over = data.card_modes.get(fm.name, CardModeOverlay())
        stray = sorted(set(over.generic) - set(fm.patterns))
        if stray:
            raise DiagnoseDataError(f"{where}: card_modes.{fm.name}.generic: {stray} are not patterns of the "
                                    "card's failure mode; list the card's own patterns")
        specific = [p for p in fm.patterns if p not in over.generic] + over.extra
        modes.append(Mode(
            fm.name, fm.symptom, fm.likely_cause, fm.how_to_confirm, fm.fix, tuple(fm.rule_ids),
            b.add(specific, f"card failure mode {fm.name}"), b.add(over.generic, f"card_modes.{fm.name}"),
            over.needs, over.typed_symptom, b.add(over.also_context, f"card_modes.{fm.name}"),
            tuple(_card_sources(card, fm.rule_ids) + over.sources),
            " ".join([fm.name.replace("-", " "), fm.symptom, fm.likely_cause, fm.how_to_confirm, fm.fix])))
    rule_ids = set(card.constraint_ids())
    for rm in data.failure_modes:
        if rm.name in card_names or any(m.name == rm.name for m in modes):
            raise DiagnoseDataError(f"{where}: failure_modes: {rm.name!r} is defined twice; rename one")
        bad = sorted(set(rm.rule_ids) - rule_ids)
        if bad:
            raise DiagnoseDataError(f"{where}: failure_modes.{rm.name}.rule_ids: {bad} are not rules of the card")
        modes.append(Mode(
            rm.name, rm.symptom, rm.likely_cause, rm.how_to_confirm, rm.fix, tuple(rm.rule_ids),
            b.add(rm.patterns, f"failure_modes.{rm.name}"), b.add(rm.generic, f"failure_modes.{rm.name}"),
            rm.needs, False, (), tuple(rm.sources),
            " ".join([rm.name.replace("-", " "), rm.symptom, rm.likely_cause, rm.how_to_confirm, rm.fix])))
    categories = tuple((c.id, c.what_to_do, b.add(c.patterns, f"not_ep_overlap.{c.id}"))
                       for c in data.not_ep_overlap)
    ctx = data.context
    return ModeSet(tuple(modes), categories, b.add(ctx.ep, "context.ep"), b.add(ctx.overlap, "context.overlap"),
                   b.add(ctx.overlap_generic, "context.overlap_generic"),
                   b.add(ctx.other_overlap, "context.other_overlap"), textmatch.Matcher(b.patterns))
