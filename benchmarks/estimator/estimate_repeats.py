#!/usr/bin/env python3
"""How far the committed repeats of one configuration agree, measured by the accuracy table's own criterion.

    python benchmarks/estimator/estimate_repeats.py      # markdown; docs/estimate.md holds it (torch-free, seconds)

The accuracy table (estimate_accuracy.py) passes a row when the prediction has the measured sign (faster /
slower / flat within 3%) and is within 10% of the measured ratio. Several of our two-H200 configurations (the
same shape, link, transport and schedule) were measured in more than one committed run. Each measurement admits
an interval of predictions that pass against it; a configuration whose runs' intervals do not intersect is one
that no prediction can pass against every run: the runs disagree with each other by more than the criterion
allows. This script says, from the same rows and with nothing fitted:

* for each configuration measured more than once: its runs, their measured range, the predictions that pass
  against all of them (or none), and whether the model's median prediction passes against the median run;
* for each row that misses: whether its prediction passes against another committed run of its configuration.

A file named `prev` ran the previous commit's layer (a before/after pair in one call): another code, so never
a repeat of a current-code configuration.
"""

from __future__ import annotations

import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.estimator import estimate_accuracy as acc  # noqa: E402


@dataclass(frozen=True)
class Admissible:
    """The predictions p that pass against one measured ratio, or against several (their intersection):
    lo <= p <= hi, with an open end where the sign's boundary is strict."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __and__(self, other: Admissible) -> Admissible:
        """The intersection: the higher low end and the lower high end; a shared end is open if either is."""
        if self.lo != other.lo:
            lo, lo_open = max((self.lo, self.lo_open), (other.lo, other.lo_open))
        else:
            lo, lo_open = self.lo, self.lo_open or other.lo_open
        if self.hi != other.hi:
            hi, hi_open = min((self.hi, self.hi_open), (other.hi, other.hi_open))
        else:
            hi, hi_open = self.hi, self.hi_open or other.hi_open
        return Admissible(lo, hi, lo_open, hi_open)

    @property
    def empty(self) -> bool:
        return self.lo > self.hi or (self.lo == self.hi and (self.lo_open or self.hi_open))

    def __contains__(self, p: float) -> bool:
        above = p > self.lo if self.lo_open else p >= self.lo
        below = p < self.hi if self.hi_open else p <= self.hi
        return above and below

    def text(self) -> str:
        if self.empty:
            return "none"
        return f"{'(' if self.lo_open else '['}{self.lo:.3f}, {self.hi:.3f}{')' if self.hi_open else ']'}"


def admissible(measured: float) -> Admissible:
    """What passes against `measured` (estimate_accuracy._row): the same sign, and |p / measured - 1| <= 10%."""
    near = Admissible(measured * (1 - acc.WITHIN), measured * (1 + acc.WITHIN))
    sign = acc._sign(measured)
    if sign == "flat":
        return near & Admissible(1 - acc.FLAT, 1 + acc.FLAT)
    if sign == "faster":
        return near & Admissible(1 + acc.FLAT, float("inf"), lo_open=True)
    return near & Admissible(0.0, 1 - acc.FLAT, hi_open=True)


def passes(predicted: float, measured: float) -> bool:
    """The table's own rule (its interval is `admissible`, up to rounding at the ends)."""
    return acc._sign(predicted) == acc._sign(measured) and abs(predicted / measured - 1) <= acc.WITHIN


def groups(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Our rows by configuration (estimate_accuracy.our_rows' `config`), in table order."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        out.setdefault(r["config"], []).append(r)
    return out


def repeated(rows: list[dict]) -> list[dict]:
    """One entry per configuration measured in more than one committed run."""
    out = []
    for config, runs in groups(rows).items():
        if len(runs) < 2:
            continue
        both = Admissible(0.0, float("inf"))
        for r in runs:
            both = both & admissible(r["measured"])
        med_m = statistics.median(r["measured"] for r in runs)
        med_p = statistics.median(r["predicted"] for r in runs)
        out.append({"what": runs[0]["what"], "config": config, "runs": runs, "all": both,
                    "median_measured": med_m, "median_predicted": med_p, "median_passes": passes(med_p, med_m)})
    return out


def widest(rows: list[dict]) -> dict:
    """The repeated configuration whose runs' measured ratios lie furthest apart (max - min, in ratio points)."""
    return max(repeated(rows), key=lambda g: max(r["measured"] for r in g["runs"]) - min(r["measured"]
                                                                                        for r in g["runs"]))


def misses(rows: list[dict]) -> list[dict]:
    """Each failing row with the other runs of its configuration its prediction passes against."""
    by = groups(rows)
    return [{"row": r, "passes_against": [o for o in by[r["config"]] if o is not r and passes(r["predicted"],
                                                                                            o["measured"])]}
            for r in rows if not r["passes"]]


def _run(r: dict) -> str:
    return Path(r["source"]).parent.name.rsplit("_", 1)[1] + " " + Path(r["source"]).stem


def markdown(rows: list[dict]) -> str:
    rep = repeated(rows)
    lines = ["| configuration | runs | measured | predicted | passes against every run | medians pass |",
             "|---|---|---|---|---|---|"]
    for g in rep:
        ms = [r["measured"] for r in g["runs"]]
        ps = [r["predicted"] for r in g["runs"]]
        ffn = f" (FFN {g['config'][3]})" if g["config"][0] == "balanced" else ""
        lines.append(f"| {g['what'].removeprefix('ours, ')}{ffn} | {len(ms)} | {min(ms):.3f}-{max(ms):.3f}x | "
                     f"{min(ps):.3f}-{max(ps):.3f}x | {g['all'].text()} | "
                     f"{'yes' if g['median_passes'] else '**no**'} ({g['median_predicted']:.3f} vs "
                     f"{g['median_measured']:.3f}) |")
    miss, by = misses(rows), groups(rows)
    contradicted = [g for g in rep if g["all"].empty]
    lines += ["", "| row that misses | run | predicted | measured | passes against another run of its "
              "configuration |", "|---|---|---|---|---|"]
    for m in miss:
        r = m["row"]
        other = "; ".join(f"{_run(o)} ({o['measured']:.3f}x)" for o in m["passes_against"]) or (
            "no" + ("" if len(by[r["config"]]) > 1 else ": measured once"))
        lines.append(f"| {r['what'].removeprefix('ours, ')} | {_run(r)} | {r['predicted']:.3f}x | "
                     f"{r['measured']:.3f}x | {other} |")
    lines += ["", f"{len(rep)} configurations were measured in more than one committed run; for "
              f"{len(contradicted)} of them no prediction passes against every run. "
              f"{sum(bool(m['passes_against']) for m in miss)} of the {len(miss)} rows that miss pass against "
              "another committed run of their configuration; "
              f"{sum(len(by[m['row']['config']]) == 1 for m in miss)} were measured once. Against each "
              f"repeated configuration's median run, {sum(g['median_passes'] for g in rep)} of {len(rep)} pass."]
    return "\n".join(lines)


def main() -> int:
    print(markdown(acc.our_rows()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
