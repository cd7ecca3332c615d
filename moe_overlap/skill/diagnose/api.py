"""Match an error message or a symptom to the known EP-overlap failure modes, best first - or say that it is
not an EP-overlap failure.

The failure modes are the card's (configuration assertions) and those of `references/runtime-failures.yaml`
(dispatcher backends, runtime hangs and timeouts, each with its upstream threads); `modes.py` merges them.
Evidence, strongest first:
  1. a mode's specific word patterns (written from the real upstream messages) and rule ids or mode names
     named in the text (e.g. pasted from `moe-overlap validate` output);
  2. its generic patterns ("hangs", "no speedup") and the words it shares with the mode's symptom / cause /
     confirmation / fix, weighted by inverse document frequency, so words every mode uses count for nothing and
     config field names count most. These count only when the text has the context the mode needs, or when it is
     a short typed symptom ("hangs", "no speedup") that is not recognisably another failure (a `not_ep_overlap`
     category such as an illegal memory access or a generic NCCL watchdog timeout).
Below `THRESHOLD` the answer is "not an EP-overlap failure", with what to do instead.
Matching is linear in the text (textmatch.py): one tokenisation, one trie walk, set lookups.
Torch-free; the card and the data file are the only data.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, Field

from moe_overlap.skill.card.cards import DEFAULT_SKILL
from moe_overlap.skill.diagnose import textmatch
from moe_overlap.skill.diagnose.modes import Mode, ModeSet, mode_set

SPECIFIC_WEIGHT = 4.0  # the first specific pattern: an upstream message is near-certain evidence
EXTRA_SPECIFIC_WEIGHT = 1.0
GENERIC_WEIGHT = 2.0  # a symptom word such as "hangs" fits many failures
EXTRA_GENERIC_WEIGHT = 0.5
RULE_ID_WEIGHT = 4.0
WORD_WEIGHT = 0.5
IDENTIFIER_BONUS = 1.5  # snake_case config names are specific; plain words less so
WORD_CAP = 2.0  # shared words alone (a long log shares many) stay below the threshold
MIN_SCORE = 0.5  # below this a mode is not listed at all
# A symptom typed in a few words ("training hangs at the first step") is read in the tool's own context, the EP
# overlap; a longer text (a pasted log or thread) must carry that context itself for generic evidence to count.
SHORT_SYMPTOM_TOKENS = 16
# Calibrated on tests/data/diagnose_labelled.yaml (upstream texts, labelled): `python tools/calibrate_diagnose.py`
# sweeps the threshold on the top raw score and prints, per threshold, the top-1 accuracy on the texts that have
# a failure mode and the "not an EP-overlap failure" rate on those that have none; THRESHOLD is the middle of the
# widest interval where both are highest (maximising the smaller of the two). tests/unit/test_diagnose_labelled.py
# holds both above 90%.
THRESHOLD = 3.0
Verdict = Literal["ep-overlap-failure", "not-an-ep-overlap-failure"]
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
    sources: list[str] = Field(default_factory=list, description="upstream threads and code behind this mode")


class NotEpOverlap(BaseModel):
    kind: str = Field(description="the kind of failure recognised (e.g. cuda-illegal-memory-access), or unrecognised")
    what_to_do: str


class DiagnosisResult(BaseModel):
    query: str
    skill: str
    verdict: Verdict = Field(description="ep-overlap-failure when a failure mode scores at or above the calibrated "
                                         "threshold, else not-an-ep-overlap-failure (matches is then empty)")
    matches: list[DiagnosisMatch]
    not_ep_overlap: NotEpOverlap | None = Field(default=None, description="set when the verdict is "
                                                "not-an-ep-overlap-failure: what the text looks like, what to do")
    hint: str | None = None


def _stem(word: str) -> str:
    # Plural "s" only: enough for "hangs"/"hang", "experts"/"expert"; identifiers are kept whole.
    if "_" not in word and len(word) > 4 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def _words(toks: list[str]) -> set[str]:
    return {_stem(w) for w in toks if len(w) > 2 and w[0].isalpha() and w not in _STOP}


_IDF: dict[int, tuple[ModeSet, list[set[str]], dict[str, float]]] = {}


def _index(ms: ModeSet) -> tuple[list[set[str]], dict[str, float]]:
    cached = _IDF.get(id(ms))
    if cached is not None and cached[0] is ms:
        return cached[1], cached[2]
    docs = [_words(textmatch.tokens(m.doc)) for m in ms.modes]
    df: dict[str, int] = {}
    for d in docs:
        for w in d:
            df[w] = df.get(w, 0) + 1
    n = len(docs)
    idf = {w: math.log((n + 1) / (c + 0.5)) for w, c in df.items()}
    _IDF.clear()
    _IDF[id(ms)] = (ms, docs, idf)
    return docs, idf


def _score(mode: Mode, hits: list[bool], ms: ModeSet, kebabs: set[str], words: set[str], doc: set[str],
           idf: dict[str, float], ctx: dict[str, bool], other_failure: bool,
           short: bool) -> tuple[float, list[str]]:
    raw, matched = 0.0, []
    spec = [ms.matcher.patterns[i].source for i in mode.specific if hits[i]]
    if spec:
        raw += SPECIFIC_WEIGHT + EXTRA_SPECIFIC_WEIGHT * (len(spec) - 1)
        matched += [f"pattern: {p}" for p in spec]
    ids = [rid for rid in (*mode.rule_ids, mode.name) if rid in kebabs]
    if ids:
        raw += RULE_ID_WEIGHT * len(ids)
        matched += [f"rule id: {rid}" if rid != mode.name else f"name: {rid}" for rid in ids]
    # Context the mode needs for its generic evidence. A text recognisably about another failure must name the
    # overlap itself; expert-parallel words alone (every MoE log has them) are not enough there.
    needs = mode.needs or "ep"
    in_context = (ctx["overlap"] or (needs == "ep" and ctx["ep"] and not other_failure)
                  or any(hits[i] for i in mode.also_context))
    typed_symptom = short and mode.typed_symptom and not other_failure
    if not (in_context or typed_symptom):
        return raw, matched  # direct evidence only
    gen = [ms.matcher.patterns[i].source for i in mode.generic if hits[i]]
    if gen:
        raw += GENERIC_WEIGHT + EXTRA_GENERIC_WEIGHT * (len(gen) - 1)
        matched += [f"generic: {p}" for p in gen]
    shared = sorted(words & doc, key=lambda w: (-idf.get(w, 0.0), w))
    word_score = sum(idf.get(w, 0.0) * (IDENTIFIER_BONUS if "_" in w else 1.0) for w in shared) * WORD_WEIGHT
    if word_score > 0:
        raw += min(word_score, WORD_CAP)
        matched += [f"words: {', '.join(shared[:6])}"]
    return raw, matched


def rank(text: str, skill: str = DEFAULT_SKILL) -> tuple[list[tuple[float, Mode, list[str]]], tuple[str, str] | None]:
    """Every mode with its raw score and evidence, best first, and the not-EP category the text matches (if any)."""
    ms = mode_set(skill)
    docs, idf = _index(ms)
    toks = textmatch.tokens(text)
    hits = ms.matcher.find(toks)
    kebabs = textmatch.kebab_words(text)
    words = _words(toks)
    any_hit = lambda ids: any(hits[i] for i in ids)  # noqa: E731
    ctx = {"ep": any_hit(ms.ep),
           "overlap": any_hit(ms.overlap) or (any_hit(ms.overlap_generic) and not any_hit(ms.other_overlap))}
    category = next(((cid, todo) for cid, todo, ids in ms.categories if any_hit(ids)), None)
    scored = []
    for mode, doc in zip(ms.modes, docs, strict=True):
        raw, matched = _score(mode, hits, ms, kebabs, words, doc, idf, ctx, category is not None,
                              len(toks) <= SHORT_SYMPTOM_TOKENS)
        scored.append((raw, mode, matched))
    scored.sort(key=lambda item: -item[0])
    return scored, category


_UNRECOGNISED = ("no known EP-overlap failure mode matches; paste the full error message (the assertion or the "
                 "first error of the failing rank), or run `moe-overlap validate CONFIG` and "
                 "`moe-overlap check-logs LOG`")


def diagnose(text: str, limit: int = 5, *, skill: str = DEFAULT_SKILL) -> DiagnosisResult:
    """Rank the failure modes of `skill` against `text` (an error message, log excerpt or symptom)."""
    # Lone surrogates (a non-UTF-8 argv decodes to them) cannot be written as JSON: replace them, in one pass.
    query = (text or "").encode("utf-8", "replace").decode("utf-8").strip()
    if not query:
        raise ValueError("diagnose needs an error message or a symptom to match (got empty text)")
    if limit < 1:
        raise ValueError(f"limit must be >= 1 (got {limit})")
    scored, category = rank(query, skill)
    top = scored[0][0] if scored else 0.0
    if top < THRESHOLD:
        kind, todo = category or ("unrecognised", _UNRECOGNISED)
        closest = ""
        if scored and scored[0][0] >= MIN_SCORE:
            closest = f" (closest known failure mode, below the threshold: {scored[0][1].name})"
        return DiagnosisResult(
            query=query, skill=skill, verdict="not-an-ep-overlap-failure", matches=[],
            not_ep_overlap=NotEpOverlap(kind=kind, what_to_do=todo),
            hint=f"not an EP-overlap failure{closest}: {todo}")
    matches = [
        DiagnosisMatch(failure_mode=m.name, score=round(raw / (raw + 2.0), 3), symptom=m.symptom,
                       likely_cause=m.likely_cause, how_to_confirm=m.how_to_confirm, fix=m.fix,
                       rule_ids=list(m.rule_ids), matched=matched, sources=list(m.sources))
        for raw, m, matched in scored[:limit] if raw >= MIN_SCORE
    ]
    return DiagnosisResult(query=query, skill=skill, verdict="ep-overlap-failure", matches=matches)
