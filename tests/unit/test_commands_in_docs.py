"""Every `moe-overlap ...` command shown in SKILL.md, card.yaml and the docs parses with the real CLI."""

import re
import shlex

import pytest

from moe_overlap.cli import COMMANDS, build_parser
from moe_overlap.paths import docs_dir, skills_dir
from moe_overlap.skill.card.cards import load_card

SKILL = skills_dir() / "perf-expert-parallel-overlap"
MARKDOWN = [SKILL / "SKILL.md", *sorted((SKILL / "references").glob("*.md")), docs_dir() / "troubleshooting.md"]
_INLINE = re.compile(r"`(moe-overlap [^`]+)`")
_FENCE = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.M | re.S)


def _runnable(cmd: str) -> bool:
    parts = cmd.split()
    # "moe-overlap diagnose" alone names the command in prose; "..." marks an elided example.
    return len(parts) > 2 and parts[1] in COMMANDS and "..." not in cmd


def _commands() -> list[tuple[str, str]]:
    found = []
    for path in MARKDOWN:
        text = path.read_text(encoding="utf-8")
        spans = _INLINE.findall(text)
        for block in _FENCE.findall(text):
            spans += [line for line in block.splitlines() if line.startswith("moe-overlap ")]
        found += [(path.name, re.sub(r"\s+#.*$", "", c).strip()) for c in spans]
    card = load_card()
    shown = [c.cli for c in card.commands if c.cli]
    shown += [card.minimal_example.validate_command, card.minimal_example.run_command]
    found += [("card.yaml", c) for c in shown]
    return sorted({(src, c) for src, c in found if _runnable(c)})


COMMANDS_SHOWN = _commands()


def test_enough_commands_found():
    assert len(COMMANDS_SHOWN) >= 15
    assert {c.split()[1] for _, c in COMMANDS_SHOWN} >= {"validate", "generate", "verify", "check-logs", "diagnose",
                                                          "estimate", "card"}


@pytest.mark.parametrize("source,command", COMMANDS_SHOWN, ids=[f"{s}:{c[:60]}" for s, c in COMMANDS_SHOWN])
def test_command_parses(source, command):
    argv = shlex.split(command)[1:]
    parser = build_parser(only=argv[0])
    try:
        parser.parse_args(argv)
    except SystemExit as exc:
        pytest.fail(f"{source}: `{command}` does not parse (exit {exc.code})")
