"""Calibrating diagnose's threshold on a labelled set: texts -> expected failure mode, or none.

`evaluate` scores a set at one threshold (top-1 accuracy on the texts that have a failure mode, the rate of
"not an EP-overlap failure" on those that have none); `sweep` does it over every threshold where the outcome
can change and picks the middle of the widest interval that maximises the smaller of the two rates. Used by
tools/calibrate_diagnose.py and tests/unit/test_diagnose_labelled.py. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from moe_overlap.skill.card.cards import DEFAULT_SKILL
from moe_overlap.skill.diagnose.api import rank


@dataclass(frozen=True)
class Scored:
    source: str
    expected: str | None
    top: str | None
    top_raw: float
    held_out: bool = False


@dataclass(frozen=True)
class Outcome:
    threshold: float
    answered_right: int
    answered: int
    none_right: int
    none: int

    @property
    def accuracy(self) -> float:
        return self.answered_right / self.answered if self.answered else 1.0

    @property
    def none_rate(self) -> float:
        return self.none_right / self.none if self.none else 1.0


def load_labelled(path: Path) -> list[dict]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    texts = data["texts"]
    for i, entry in enumerate(texts):
        if not {"source", "expected", "text"} <= set(entry) <= {"source", "expected", "text", "held_out"} or not str(
                entry["text"]).strip():
            raise ValueError(f"{path}: texts[{i}] needs source, expected (a failure mode or null) and text "
                             "(and optionally held_out)")
    return texts


def score_all(texts: list[dict], skill: str = DEFAULT_SKILL) -> list[Scored]:
    out = []
    for entry in texts:
        scored, _ = rank(str(entry["text"]).strip(), skill)
        raw, mode = (scored[0][0], scored[0][1].name) if scored else (0.0, None)
        out.append(Scored(entry["source"], entry["expected"], mode, raw, bool(entry.get("held_out"))))
    return out


def evaluate(scored: list[Scored], threshold: float) -> Outcome:
    answered = [s for s in scored if s.expected]
    none = [s for s in scored if not s.expected]
    right = sum(1 for s in answered if s.top_raw >= threshold and s.top == s.expected)
    none_right = sum(1 for s in none if s.top_raw < threshold)
    return Outcome(threshold, right, len(answered), none_right, len(none))


def sweep(scored: list[Scored]) -> tuple[float, list[Outcome]]:
    """Outcomes at each candidate threshold (midpoints between distinct top scores) and the chosen one."""
    raws = sorted({round(s.top_raw, 6) for s in scored} | {0.0})
    candidates = [(a + b) / 2 for a, b in zip(raws, raws[1:], strict=False)] + [raws[-1] + 1.0]
    outcomes = [evaluate(scored, t) for t in candidates]
    best = max(min(o.accuracy, o.none_rate) for o in outcomes)
    # the widest run of consecutive distinct scores where the best holds; its middle is the most robust choice
    good = [i for i, o in enumerate(outcomes) if min(o.accuracy, o.none_rate) == best]
    runs, start = [], good[0]
    for a, b in zip(good, good[1:] + [None], strict=True):
        if b != a + 1:
            runs.append((start, a))
            start = b
    lo_i, hi_i = max(runs, key=lambda r: raws[r[1] + 1] - raws[r[0]])
    lo, hi = raws[lo_i], raws[min(hi_i + 1, len(raws) - 1)]
    return round((lo + hi) / 2, 2), outcomes
