"""Speedups of an ep_overlap.py results file against the run a user makes with overlap off.

The baseline is the sequential layer (`none`) over the fastest transport measured for it: the file's own
`none`, or, when the same call also ran the other transport (a *partner* file: same folder, native fabric, the
other `--a2a`, started within PARTNER_WINDOW_S), the faster of the two. Every schedule's ratio is
baseline_ms / schedule_ms. `nodes` (the 1F1B node functions run one after another) is kept as a diagnostic only:
it is 5-11 % slower than `none` at some shapes, so a ratio against it flatters the overlap.

    python benchmarks/gpu/ratios.py FILE.json [--partner FILE.json | --no-partner] [--markdown]
    python benchmarks/gpu/ratios.py docs/benchmarks.md --update   # the doc's generated ratio tables
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from datetime import datetime
from pathlib import Path

PARTNER_WINDOW_S = 120.0
_TRANSPORT = {"nccl": "NCCL", "ce": "copy engines", None: "the group's own"}


def load(path: str | Path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _when(doc: dict) -> datetime:
    return datetime.fromisoformat(doc["date"])


def find_partner(path: str | Path) -> Path | None:
    """The same call's file with the other transport (see the module docstring), or None."""
    path = Path(path)
    doc = load(path)
    if doc.get("fabric") != "native" or doc.get("a2a") not in ("nccl", "ce"):
        return None
    best = None
    for other in sorted(path.parent.glob("*.json")):
        if other == path:
            continue
        try:
            o = load(other)
        except (OSError, ValueError):
            continue
        if not isinstance(o, dict) or "presets" not in o or o.get("fabric") != "native":
            continue
        same_shapes = [x["preset"] for x in o["presets"]] == [x["preset"] for x in doc["presets"]]
        if (o.get("a2a") in ("nccl", "ce") and o["a2a"] != doc["a2a"] and o.get("world") == doc.get("world")
                and same_shapes):
            gap = abs((_when(o) - _when(doc)).total_seconds())
            if gap <= PARTNER_WINDOW_S and (best is None or gap < best[0]):
                best = (gap, other)
    return best[1] if best else None


def _row(preset: dict, schedule: str) -> dict | None:
    return next((r for r in preset["rows"] if r["schedule"] == schedule), None)


def fastest_none(docs: list[dict], preset_name: str) -> tuple[float, str]:
    """(total ms, transport) of the fastest `none` of `preset_name` over `docs`."""
    cands = []
    for d in docs:
        p = next((p for p in d["presets"] if p["preset"] == preset_name), None)
        if p is not None and _row(p, "none") is not None:
            cands.append((_row(p, "none")["total_ms"], _TRANSPORT.get(d.get("a2a"), str(d.get("a2a")))))
        if p is not None and _row(p, "none-nccl") is not None:  # ep_overlap.py's own NCCL `none` beside ce
            cands.append((_row(p, "none-nccl")["total_ms"], "NCCL"))
    if not cands:
        raise ValueError(f"no `none` row for preset {preset_name}")
    return min(cands)


def ratios(path: str | Path, partner: str | Path | None | bool = True) -> dict:
    """{preset: {baseline_ms, baseline_transport, speedup_vs_fastest_none: {schedule: x},
    speedup_vs_nodes_diagnostic: {schedule: x}, total_ms: {schedule: ms}}}; partner True: find it."""
    doc = load(path)
    if partner is True:
        partner = find_partner(path)
    docs = [doc] + ([load(partner)] if partner else [])
    out = {"file": str(path), "partner": str(partner) if partner else None, "transport": _TRANSPORT.get(doc.get("a2a")),
           "fabric": doc.get("fabric"), "presets": {}}
    for p in doc["presets"]:
        base_ms, base_tr = fastest_none(docs, p["preset"])
        nodes = _row(p, "nodes")
        out["presets"][p["preset"]] = {
            "baseline_ms": base_ms, "baseline_transport": base_tr,
            "total_ms": {r["schedule"]: r["total_ms"] for r in p["rows"]},
            "speedup_vs_fastest_none": {r["schedule"]: base_ms / r["total_ms"] for r in p["rows"]
                                        if r["schedule"] != "none" or len(docs) > 1},
            "speedup_vs_nodes_diagnostic": ({r["schedule"]: nodes["total_ms"] / r["total_ms"] for r in p["rows"]
                                             if r["schedule"].startswith("1f1b")} if nodes else {}),
        }
    return out


def markdown(res: dict, schedules: tuple[str, ...] = ("none", "nodes", "1f1b", "1f1b+wgrad")) -> str:
    """One table: per preset, ms and x vs the fastest `none` (the diagnostic `nodes` ratio last)."""
    lines = ["| preset | baseline: fastest `none` ms (transport) | " + " | ".join(schedules)
             + " | 1f1b vs `nodes` (diagnostic) |", "|---" * (len(schedules) + 3) + "|"]
    for name, p in res["presets"].items():
        cells = []
        for s in schedules:
            if s not in p["total_ms"]:
                cells.append("-")
                continue
            x = p["speedup_vs_fastest_none"].get(s)
            cells.append(f"{p['total_ms'][s]:.2f}" + (f" ({x:.3f}x)" if x is not None else ""))
        diag = p["speedup_vs_nodes_diagnostic"].get("1f1b")
        lines.append(f"| {name} | {p['baseline_ms']:.2f} ({p['baseline_transport']}) | " + " | ".join(cells)
                     + f" | {'-' if diag is None else f'{diag:.3f}'} |")
    return "\n".join(lines)


BLOCK = re.compile(r"(<!-- ratios: (\S+) -->\n)(.*?)(<!-- /ratios -->)", re.S)


def update_doc(text: str, root: Path = Path(".")) -> str:
    """Regenerate every `<!-- ratios: FILE -->` ... `<!-- /ratios -->` block of a markdown text from FILE."""
    return BLOCK.sub(lambda m: m.group(1) + markdown(ratios(root / m.group(2))) + "\n" + m.group(4), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("file", help="a results JSON, or with --update a markdown file whose ratio blocks to redo")
    ap.add_argument("--update", action="store_true", help="rewrite FILE's `<!-- ratios: ... -->` blocks")
    ap.add_argument("--partner", default=None, help="the same call's file with the other transport")
    ap.add_argument("--no-partner", action="store_true", help="only this file's own `none`")
    ap.add_argument("--markdown", action="store_true")
    a = ap.parse_args(argv)
    if a.update:
        path = Path(a.file)
        path.write_text(update_doc(path.read_text(encoding="utf-8")), encoding="utf-8")
        return 0
    res = ratios(a.file, False if a.no_partner else (a.partner or True))
    print(markdown(res) if a.markdown else json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
