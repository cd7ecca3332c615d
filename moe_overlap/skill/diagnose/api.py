"""Match an error message or a symptom to the card's failure modes, best first.

Ranking, strongest signal first:
  1. a failure mode's `patterns` (regular expressions written from the real upstream assertion messages);
  2. a rule id named in the text (e.g. pasted from `moe-overlap validate` output);
  3. words shared with the failure mode's symptom / cause / confirmation / fix, weighted by inverse document
     frequency over all failure modes, so words every mode uses ("overlap", "expert") count for nothing and
     config field names (`moe_shared_expert_overlap`) count most.
Torch-free; the card is the only data.
"""

from __future__ import annotations

import math
import re

from pydantic import BaseModel, Field

from moe_overlap.skill.card.cards import DEFAULT_SKILL, load_card
from moe_overlap.skill.card.model import Card, FailureMode

PATTERN_WEIGHT = 4.0  # the first matching pattern: an upstream message is near-certain evidence
EXTRA_PATTERN_WEIGHT = 1.0
RULE_ID_WEIGHT = 4.0
WORD_WEIGHT = 0.5
IDENTIFIER_BONUS = 1.5  # snake_case config names are specific; plain words less so
MIN_SCORE = 0.5  # below this a "match" is noise: a shared common word or two
_WORD = re.compile(r"[a-z][a-z0-9_]+")
_STOP = frozenset(
    "the a an and or of to in on for with without when is are be was were it its this that not no at by as from "
    "than then only must does do did use used set has have after before my our we i can".split()
)


class DiagnosisMatch(BaseModel):
    failure_mode: str
    score: float = Field(ge=0, le=1, description="relative confidence in [0, 1); higher is better")
    symptom: str
    likely_cause: str
    how_to_confirm: str
    fix: str
    rule_ids: list[str]
    matched: list[str] = Field(default_factory=list, description="what in the text matched (patterns, ids, words)")


class DiagnosisResult(BaseModel):
    query: str
    skill: str
    matches: list[DiagnosisMatch]
    hint: str | None = None


def _stem(word: str) -> str:
    # Plural "s" only: enough for "hangs"/"hang", "experts"/"expert"; identifiers are kept whole.
    if "_" not in word and len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _words(text: str) -> set[str]:
    return {_stem(w) for w in _WORD.findall(text.lower()) if w not in _STOP and len(w) > 2}


def _doc(fm: FailureMode) -> str:
    return " ".join([fm.name.replace("-", " "), fm.symptom, fm.likely_cause, fm.how_to_confirm, fm.fix])


_INDEX: dict[int, tuple[Card, tuple]] = {}


def _index(card: Card) -> tuple[list[set[str]], dict[str, float], list[list[re.Pattern]]]:
    """Word sets, idf and compiled patterns of a card; cached per card object (load_card caches the card)."""
    cached = _INDEX.get(id(card))
    if cached is not None and cached[0] is card:
        return cached[1]
    docs = [_words(_doc(fm)) for fm in card.failure_modes]
    n = len(docs)
    df: dict[str, int] = {}
    for d in docs:
        for w in d:
            df[w] = df.get(w, 0) + 1
    idf = {w: math.log((n + 1) / (c + 0.5)) for w, c in df.items()}
    patterns = [[re.compile(p, re.IGNORECASE) for p in fm.patterns] for fm in card.failure_modes]
    _INDEX.clear()  # one card in practice; never grow without bound
    _INDEX[id(card)] = (card, (docs, idf, patterns))
    return docs, idf, patterns


def _score(text: str, words: set[str], fm: FailureMode, doc: set[str], idf: dict[str, float],
           patterns: list[re.Pattern]) -> tuple[float, list[str]]:
    raw = 0.0
    matched: list[str] = []
    hits = [p.pattern for p in patterns if p.search(text)]
    if hits:
        raw += PATTERN_WEIGHT + EXTRA_PATTERN_WEIGHT * (len(hits) - 1)
        matched += [f"pattern: {h}" for h in hits]
    ids = [rid for rid in fm.rule_ids if re.search(rf"(?<![a-z0-9-]){re.escape(rid)}(?![a-z0-9-])", text.lower())]
    if ids:
        raw += RULE_ID_WEIGHT * len(ids)
        matched += [f"rule id: {rid}" for rid in ids]
    shared = sorted(words & doc, key=lambda w: -idf.get(w, 0.0))
    word_score = sum(idf.get(w, 0.0) * (IDENTIFIER_BONUS if "_" in w else 1.0) for w in shared) * WORD_WEIGHT
    if word_score > 0:
        raw += word_score
        matched += [f"words: {', '.join(shared[:6])}"]
    return raw, matched


def diagnose(text: str, limit: int = 5, *, skill: str = DEFAULT_SKILL) -> DiagnosisResult:
    """Rank the failure modes of `skill`'s card against `text` (an error message, log excerpt or symptom)."""
    query = (text or "").strip()
    if not query:
        raise ValueError("diagnose needs an error message or a symptom to match (got empty text)")
    if limit < 1:
        raise ValueError(f"limit must be >= 1 (got {limit})")
    card = load_card(skill)
    docs, idf, patterns = _index(card)
    words = _words(query)
    scored = []
    for fm, doc, pats in zip(card.failure_modes, docs, patterns, strict=True):
        raw, matched = _score(query, words, fm, doc, idf, pats)
        if raw >= MIN_SCORE:
            scored.append((raw, fm, matched))
    scored.sort(key=lambda item: -item[0])
    matches = [
        DiagnosisMatch(failure_mode=fm.name, score=round(raw / (raw + 2.0), 3), symptom=fm.symptom,
                       likely_cause=fm.likely_cause, how_to_confirm=fm.how_to_confirm, fix=fm.fix,
                       rule_ids=list(fm.rule_ids), matched=matched)
        for raw, fm, matched in scored[:limit]
    ]
    hint = None
    if not matches:
        hint = ("no known failure mode matched; paste the full assertion message, or run "
                "`moe-overlap validate CONFIG` and `moe-overlap check-logs LOG`")
    return DiagnosisResult(query=query, skill=skill, matches=matches, hint=hint)
