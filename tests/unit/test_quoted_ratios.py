"""Every speedup quoted in the docs, the README and the card, recomputed from its committed JSON.

Layer speedups are against the fastest `none` of the file or of its same-call partner (benchmarks/gpu/ratios.py),
never against `nodes`; the registry benchmarks/results/quoted_ratios.json names each quote's source, and every
three-decimal ratio in the scanned texts must be in a registered quote or in a generated table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from benchmarks.gpu import ratios as R

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = json.loads((ROOT / "benchmarks/results/quoted_ratios.json").read_text(encoding="utf-8"))
TOKEN = re.compile(r"(?<![\d.])(\d\.\d{3})(?:-(\d\.\d{3}))?x|x(\d\.\d{3})(?:-(\d\.\d{3}))?(?![\d])")
CARD = "skills/perf-expert-parallel-overlap/card.yaml"
WILL_IT_PAY = "skills/perf-expert-parallel-overlap/references/will-it-pay.md"
SKILL = "skills/perf-expert-parallel-overlap/SKILL.md"


def _text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _tokens(text: str) -> list[tuple[float, float | None]]:
    out = []
    for m in TOKEN.finditer(text):
        lo, hi = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
        out.append((float(lo), float(hi) if hi else None))
    return out


def _files(src: str) -> list[str]:
    return REGISTRY["sets"].get(src, [src])


def _as_list(v):
    return v if isinstance(v, list) else [v]


def _layer_values(spec: dict) -> list[float]:
    """T_none / T_schedule; `nodes_diagnostic`: T_nodes / T_schedule, allowed only in a column labelled so."""
    key = "layer" if "layer" in spec else "nodes_diagnostic"
    vals = []
    for f in _files(spec[key]):
        res = R.ratios(ROOT / f)
        for preset in _as_list(spec["preset"]):
            p = res["presets"][preset]
            for sched in _as_list(spec["schedule"]):
                if key == "layer":
                    vals.append(1.0 if sched == "none" and sched not in p["speedup_vs_fastest_none"]
                                else p["speedup_vs_fastest_none"][sched])
                else:
                    vals.append(p["total_ms"]["nodes"] / p["total_ms"][sched])
    return vals


def _verify_values(spec: dict, key: str) -> list[float]:
    vals = []
    for f in _files(spec[key]):
        doc = json.loads((ROOT / f).read_text(encoding="utf-8"))
        if key == "verify":
            crit = next(c for c in doc["criteria"] if "comparisons" in c.get("evidence", {}))
            comp = next(c for c in crit["evidence"]["comparisons"] if c["mode"] == spec["mode"])
            vals.append(comp["ratio"])
        else:
            vals.append(next(m for m in doc["analysis"]["modes"] if m["mode"] == spec["mode"])["predicted_ratio"])
    return vals


def _values(spec: dict) -> list[float]:
    if "layer" in spec or "nodes_diagnostic" in spec:
        return _layer_values(spec)
    return _verify_values(spec, "verify" if "verify" in spec else "prediction")


def _agrees(quoted: float, value: float) -> bool:
    return abs(quoted - value) <= 0.0005 + 1e-9


@pytest.mark.parametrize("claim", REGISTRY["claims"], ids=lambda c: f"{c['in']}: {c['text'][:50]}")
def test_quote_recomputes_from_its_file(claim):
    text = _text(claim["in"])
    assert claim["text"] in text, f"{claim['in']} no longer says {claim['text']!r}: update quoted_ratios.json"
    tokens = _tokens(claim["text"])
    assert len(tokens) == len(claim["values"]), "one source per quoted ratio"
    for (lo, hi), spec in zip(tokens, claim["values"], strict=True):
        if "nodes_diagnostic" in spec:  # only in a column that says what it is
            assert "x vs nodes (diagnostic)" in text, f"{claim['text']!r}: a ratio against `nodes` not labelled"
        vals = _values(spec)
        if hi is None:
            assert len(set(vals)) == 1 and _agrees(lo, vals[0]), f"{lo} != {vals} ({spec})"
        else:
            assert _agrees(lo, min(vals)) and _agrees(hi, max(vals)), f"{lo}-{hi} != {min(vals)}-{max(vals)} ({spec})"


def _scanned() -> dict[str, str]:
    """The texts whose every three-decimal ratio must be registered: docs/benchmarks.md's EP 2 sections (the
    generated tables left out: test_generated_tables covers them), the README, the card's rows of our own
    measurements, will-it-pay.md's section on them, SKILL.md."""
    bench = R.BLOCK.sub("", _text("docs/benchmarks.md"))
    ep2 = "\n".join(s for s in re.split(r"\n(?=## )", bench) if s.startswith("## Two H200s"))
    card = yaml.safe_load(_text(CARD))
    rows = [r for r in card["expected_metric_change"] if str(r.get("source", "")).startswith("moe-overlap-h200")]
    pay = _text(WILL_IT_PAY)
    return {"docs/benchmarks.md": ep2, "README.md": _text("README.md"),
            CARD: "\n".join(str(r["magnitude"]) for r in rows), WILL_IT_PAY: pay[pay.index("## This package"):],
            SKILL: _text(SKILL)}


def test_every_quoted_ratio_is_registered():
    for name, text in _scanned().items():
        registered = [c["text"] for c in REGISTRY["claims"] if c["in"] == name]
        if name == CARD:  # the card's folded scalars: compare without line breaks and indentation
            registered = [re.sub(r"\s+", " ", t) for t in registered]
            text = re.sub(r"\s+", " ", text)
        rest = text
        for t in registered:
            rest = rest.replace(t, "")
        left = [m.group(0) for m in TOKEN.finditer(rest)]
        assert not left, f"{name}: ratios quoted without a source in quoted_ratios.json: {left}"


def test_no_quoted_ratio_is_against_nodes():
    for name, text in _scanned().items():
        for line in text.splitlines():
            against_nodes = re.search("(?:" + TOKEN.pattern + r")[^;()]{0,12}?\b(vs|against) `?nodes", line) or re.search(
                r"\bx (vs|against) `?nodes", line)
            if against_nodes and "diagnostic" not in line:
                pytest.fail(f"{name}: a ratio against `nodes` (label it a diagnostic or use `none`): {line.strip()}")


def test_generated_tables_match_the_files():
    text = _text("docs/benchmarks.md")
    assert len(R.BLOCK.findall(text)) >= 19
    assert R.update_doc(text, ROOT) == text, "run: python benchmarks/gpu/ratios.py docs/benchmarks.md --update"


def test_fastest_none_takes_the_same_call_partner():
    """The third round's first NCCL/copy-engine pair: the DSv3 proxy's `none` was faster over copy engines."""
    nccl = ROOT / "benchmarks/results/h200x2_2026-11-29_r3/ep_overlap_cuda_r2.json"
    assert R.find_partner(nccl).name == "ep_overlap_cuda_r2_ce.json"
    res = R.ratios(nccl)["presets"]
    assert res["dsv3-proxy"]["baseline_transport"] == "copy engines"
    assert res["qwen3-30b-a3b"]["baseline_transport"] == "NCCL"
    alone = R.ratios(nccl, partner=False)["presets"]["dsv3-proxy"]
    assert alone["baseline_ms"] > res["dsv3-proxy"]["baseline_ms"]
    # a different code version in the same folder (the previous commit's Qwen3-only file) is no partner
    assert R.find_partner(ROOT / "benchmarks/results/h200x2_2026-11-29_r3/ep_overlap_prev_qwen3.json") is None


def test_ep_overlap_writes_speedup_against_none():
    from benchmarks.gpu import ep_overlap

    keys = ["none/fwd", "none/bwd", "chunked:2/fwd", "chunked:2/bwd", "nodes/fwd", "nodes/bwd"]
    t = {k: {"median_ms": 1.0} for k in keys}
    t["nodes/fwd"] = {"median_ms": 1.5}
    t.update({"1f1b/pair": {"median_ms": 2.2}, "1f1b+wgrad/pair": {"median_ms": 1.8}})
    t.update({f"alone/{k}": {"median_ms": 0.5} for k in ("a2a dispatch", "a2a combine", "a2a grad-combine",
                                                         "a2a grad-dispatch", "experts fwd", "experts dgrad",
                                                         "experts wgrad", "count exchange")})
    rows = {r["schedule"]: r for r in ep_overlap.derive({"times": t}, [2])["rows"]}
    assert rows["1f1b"]["speedup_vs_fastest_none"] == pytest.approx(2.0 / 2.2)  # slower than none ...
    assert rows["1f1b"]["speedup_vs_nodes"] == pytest.approx(2.5 / 2.2)  # ... though faster than nodes
    assert rows["1f1b"]["reference_role"] == "diagnostic"
    assert "speedup_vs_nodes" not in rows["chunked:2"]


def test_a_copy_engine_run_times_none_over_nccl_too(tmp_path):
    """ep_overlap.py with --a2a ce times `none` over NCCL as well; the faster `none` is the baseline."""
    from benchmarks.gpu import ep_overlap

    keys = ["none/fwd", "none/bwd", "none-nccl/fwd", "none-nccl/bwd", "nodes/fwd", "nodes/bwd"]
    t = {k: {"median_ms": 1.0} for k in keys}
    t["none/fwd"] = {"median_ms": 1.4}  # copy engines slower alone, as at the Qwen3 shape
    t.update({"1f1b/pair": {"median_ms": 2.1}, "1f1b+wgrad/pair": {"median_ms": 2.1}})
    t.update({f"alone/{k}": {"median_ms": 0.5} for k in ("a2a dispatch", "a2a combine", "a2a grad-combine",
                                                         "a2a grad-dispatch", "experts fwd", "experts dgrad",
                                                         "experts wgrad", "count exchange")})
    derived = ep_overlap.derive({"times": t}, [])
    rows = {r["schedule"]: r for r in derived["rows"]}
    assert rows["1f1b"]["speedup_vs_fastest_none"] == pytest.approx(2.0 / 2.1)
    doc = {"date": "2026-12-01T00:00:00+00:00", "fabric": "native", "a2a": "ce", "world": 2,
           "presets": [{"preset": "p", **derived}]}
    path = tmp_path / "ce.json"
    path.write_text(json.dumps(doc))
    res = R.ratios(path)["presets"]["p"]
    assert res["baseline_transport"] == "NCCL" and res["baseline_ms"] == pytest.approx(2.0)
