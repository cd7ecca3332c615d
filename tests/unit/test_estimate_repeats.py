"""How far the committed repeats of one configuration agree (benchmarks/estimator/estimate_repeats.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.estimator import estimate_accuracy as acc
from benchmarks.estimator import estimate_repeats as rp

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def rows():
    return acc.our_rows()


def test_docs_block_is_the_scripts(rows):
    doc = (ROOT / "docs/estimate.md").read_text(encoding="utf-8")
    start, end = "<!-- repeats-table:start -->\n", "\n<!-- repeats-table:end -->"
    committed = doc[doc.index(start) + len(start):doc.index(end)]
    assert committed == rp.markdown(rows), (
        "docs/estimate.md is stale: paste `python benchmarks/estimator/estimate_repeats.py` between the "
        "repeats-table markers")


def test_admissible_is_the_tables_criterion(rows):
    """The interval a measurement admits passes exactly the predictions the accuracy table passes."""
    assert all(rp.passes(r["predicted"], r["measured"]) == r["passes"] for r in rows)
    # and the interval holds what the rule passes, away from its ends (where rounding decides)
    for measured in (0.80, 0.965, 0.969, 0.99, 1.0, 1.029, 1.031, 1.2, *(r["measured"] for r in rows)):
        iv = rp.admissible(measured)
        for p in (0.72, 0.8, 0.9, 0.969, 0.971, 1.0, 1.029, 1.0301, 1.1, 1.2, 1.32, *(r["predicted"] for r in rows)):
            if min(abs(p - iv.lo), abs(p - iv.hi)) > 1e-9:
                assert (p in iv) == acc._row("x", "x", p, measured, "")["passes"], (p, measured)


def test_intervals_and_their_ends():
    flat, faster = rp.admissible(0.991), rp.admissible(1.051)
    assert (flat.lo, flat.hi) == (0.97, 1.03) and not flat.lo_open and not flat.hi_open
    assert faster.lo == 1.03 and faster.lo_open and faster.hi == pytest.approx(1.051 * 1.1)
    # flat keeps 1.03, faster excludes it: the two meet at a point neither admits
    assert (flat & faster).empty and 1.03 in flat and 1.03 not in faster
    assert rp.admissible(0.95).hi == 0.97 and rp.admissible(0.95).hi_open
    assert not (rp.admissible(1.05) & rp.admissible(1.10)).empty
    assert (rp.admissible(1.0) & rp.admissible(1.25)).empty  # 10% of 1.25 does not reach flat


def test_repeats_are_distinct_runs_of_one_configuration(rows):
    """A configuration's runs come from different files, share preset, link, transport and schedule, and a
    `prev` file (the previous commit's layer) is never a repeat of the current code."""
    rep = rp.repeated(rows)
    assert len(rep) >= 10
    for g in rep:
        files = [r["source"] for r in g["runs"]]
        assert len(set(files)) == len(files)
        assert len({r["what"] for r in g["runs"]}) == 1
        assert all("prev" not in Path(f).stem for f in files) or all("prev" in Path(f).stem for f in files)
    # the shape is part of the configuration: the emulated-link runs at different FFN sizes are not repeats
    ffns = {}
    for path in acc._files():
        data = json.loads(path.read_text(encoding="utf-8"))
        for p in data["presets"]:
            if p["preset"] == "balanced":
                ffns.setdefault(p["shape"]["ffn"], set()).add(str(path.relative_to(ROOT)))
    for g in rep:
        if g["config"][0] == "balanced":
            assert {r["source"] for r in g["runs"]} <= ffns[g["config"][3]]


def test_a_miss_that_passes_against_a_repeat_is_one_the_runs_disagree_on(rows):
    """Every miss said to pass against another run does pass against that run's measurement, and that run is of
    the same configuration; every configuration said to have no common prediction has two runs whose intervals
    do not meet."""
    for m in rp.misses(rows):
        for o in m["passes_against"]:
            assert o["config"] == m["row"]["config"] and acc._row("x", "x", m["row"]["predicted"],
                                                                  o["measured"], "")["passes"]
    for g in rp.repeated(rows):
        if g["all"].empty:
            ivs = [rp.admissible(r["measured"]) for r in g["runs"]]
            assert any((a & b).empty for a in ivs for b in ivs)


def test_the_cards_spread_is_the_widest_repeat(rows):
    """The card's known limitation quotes the widest spread of one configuration's runs, and its two examples."""
    import yaml

    card = yaml.safe_load((ROOT / "skills/perf-expert-parallel-overlap/card.yaml").read_text(encoding="utf-8"))
    text = next(k["text"] for k in card["known_limitations"] if k["source"] == ["moe-overlap-repeats"])
    g = rp.widest(rows)
    ms = sorted(r["measured"] for r in g["runs"])
    assert f"up to {round((ms[-1] - ms[0]) * 100)} points wide" in text
    measuring = (ROOT / "skills/perf-expert-parallel-overlap/references/measuring.md").read_text(encoding="utf-8")
    assert f"up to {round((ms[-1] - ms[0]) * 100)} points wide" in " ".join(measuring.split())
    assert g["config"][0] == "qwen3-30b-a3b" and g["config"][6:8] == ("native", "nccl")
    assert f"from {round((1 - ms[0]) * 100)}% slower to flat" in text and acc._sign(ms[-1]) == "flat"
    proxy = next(x for x in rp.repeated(rows) if x["config"][0] == "dsv3-proxy" and x["config"][6:9] == (
        "native", "nccl", "1f1b+wgrad"))
    pm = sorted(r["measured"] for r in proxy["runs"])
    assert acc._sign(pm[0]) == "flat" and all(acc._sign(m) == "faster" for m in pm[1:])
    assert f"{round((pm[1] - 1) * 100)}-{round((pm[-1] - 1) * 100)}% faster in {len(pm) - 1} others" in text.replace(
        "four", "4")
