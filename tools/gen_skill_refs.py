#!/usr/bin/env python3
"""Regenerate the tables of the skill's references that restate data: the constraint tables of
references/constraints.md and references/constraints-wgrad-flex.md (from card.yaml's constraints), the per-release
table of references/releases.md and the upstream lines of references/upstream-lines.md (both from the rules,
moe_overlap/skill/rules/). Each table sits between `<!-- generated:NAME -->` and `<!-- /generated -->`; the prose
around it is written by hand.

    python tools/gen_skill_refs.py          # write
    python tools/gen_skill_refs.py --check  # exit 1 if a committed table is stale (tests/unit/test_skill_facts.py)
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe_overlap.skill.card.cards import load_card, skill_dir  # noqa: E402
from moe_overlap.skill.rules.registry import all_rules  # noqa: E402
from moe_overlap.skill.rules.versions import KNOWN_CORE_RELEASES  # noqa: E402

SKILL = "perf-expert-parallel-overlap"
OVERLAP_ON = "comm_overlap.overlap_moe_expert_parallel_comm is true"
CHECKERS = {"megatron-core": "Core", "megatron-lm": "Megatron-LM", "megatron-bridge": "Bridge",
            "moe-overlap": "moe-overlap"}
KIND = {"core": "Core", "runtime": "run time", "bridge": "Bridge", "advice": "advice"}


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())


# The constraint table is split over two pages (each under ~7,000 characters): the rules of delayed wgrad (and its
# one-micro-batch alternative) and of the flex backends go to the second, by id.
WGRAD_FLEX = ("wgrad-", "dispatch-wgrad-", "flex-", "deepep-", "ncclep-")


def constraints_table(wgrad_flex: bool = False) -> str:
    """One row per card constraint of the page's families: id, when, requires, severity, releases, checked by."""
    lines = ["| id | when | requires | severity | releases | checked by |", "|---|---|---|---|---|---|"]
    for c in load_card(SKILL).constraints:
        if c.id.startswith(WGRAD_FLEX) != wgrad_flex:
            continue
        when = "overlap on" if c.applies_when == OVERLAP_ON else c.applies_when
        who = ", ".join(CHECKERS[k] for k in c.checked_by)
        lines.append(f"| `{c.id}` | {_cell(when)} | {_cell(c.requires)} | {c.severity} | {c.releases} | {who} |")
    return "\n".join(lines)


def releases_table() -> str:
    """The rules whose part in the rule set differs between release lines: who enforces each, per line."""
    heads = [f"{a}.{b}" for a, b in KNOWN_CORE_RELEASES]
    lines = ["| rule | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for rule in all_rules():
        cells = [KIND[rule.kind(line)] if rule.applies_to(line) else "-" for line in KNOWN_CORE_RELEASES]
        if len(set(cells)) > 1:
            lines.append(f"| `{rule.id}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


_PATH = re.compile(r"\b((?:src/)?megatron/[\w/]+/)(\w+\.py)")


def upstream_table() -> str:
    """Where upstream enforces each rule, per release (the rules' own sources), file paths shortened to their names
    with a legend: the card does not restate them."""
    legend: dict[str, str] = {}

    def short(m: re.Match) -> str:
        legend.setdefault(m.group(2), m.group(1) + m.group(2))
        return m.group(2)

    rows = []
    for rule in all_rules():
        text = _PATH.sub(short, rule.source).replace("megatron-core ", "Core ").replace("megatron-bridge ", "Bridge ")
        rows.append(f"| `{rule.id}` | {_cell(text)} |")
    lines = ["Files: " + "; ".join(f"`{name}` = `{full}`" for name, full in sorted(legend.items())) + ".", "",
             "| rule | upstream (file:line per release) |", "|---|---|", *rows]
    return "\n".join(lines)


BLOCKS = {"constraints.md": ("constraints", constraints_table),
          "constraints-wgrad-flex.md": ("constraints", lambda: constraints_table(wgrad_flex=True)),
          "releases.md": ("releases", releases_table),
          "upstream-lines.md": ("upstream", upstream_table)}


def render(text: str, name: str, table: str) -> str:
    pattern = re.compile(rf"(<!-- generated:{name} -->\n)(?:.*?\n)?(<!-- /generated -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- generated:{name} --> ... <!-- /generated --> block")
    return pattern.sub(lambda m: m.group(1) + table + "\n" + m.group(2), text)


def stale_files(write: bool) -> list[str]:
    stale = []
    for file, (name, make) in BLOCKS.items():
        path = skill_dir(SKILL) / "references" / file
        text = path.read_text(encoding="utf-8")
        new = render(text, name, make())
        if new != text:
            stale.append(file)
            if write:
                path.write_text(new, encoding="utf-8")
    return stale


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only check, write nothing")
    args = ap.parse_args()
    stale = stale_files(write=not args.check)
    if args.check and stale:
        print("stale: " + ", ".join(stale) + " (run python tools/gen_skill_refs.py)", file=sys.stderr)
        return 1
    print(("updated: " + ", ".join(stale)) if stale else "up to date")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
