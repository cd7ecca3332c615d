"""Every `moe-overlap ...` command shown in SKILL.md, card.yaml and the docs parses with the real CLI."""

import re
import shlex
from pathlib import Path

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


# The benchmark scripts the docs, the card and the code name: `python benchmarks/<folder>/<script>.py ...`
# and `bash benchmarks/<script>.sh` commands, and any other mention of a benchmarks/ script, must name a
# file that is there (scripts move between folders; a stale path in a doc is a command that fails).
ROOT = Path(__file__).resolve().parents[2]
_BENCH_COMMAND = re.compile(r"(?:python3?|bash)\s+(benchmarks/[\w/.-]+\.(?:py|sh))\b")
_BENCH_PATH = re.compile(r"(?<![\w/.-])benchmarks/[\w/.-]*?\.(?:py|sh)\b")
_RESULT_COMMAND = re.compile(r'"command": "((?:[^"\\]|\\.)*)"')


def _texts() -> dict[str, str]:
    paths = [*ROOT.glob("docs/*.md"), ROOT / "README.md", *(ROOT / "skills").rglob("*.md"),
             *(ROOT / "skills").rglob("*.yaml"), *(ROOT / "moe_overlap").rglob("*.py"),
             *(ROOT / "tests").rglob("*.py"),
             *[p for p in (ROOT / "benchmarks").rglob("*") if p.suffix in (".py", ".sh")
               and "results" not in p.relative_to(ROOT).parts]]
    return {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in paths}


def _missing(found: list[tuple[str, str]]) -> list[str]:
    return sorted({f"{src}: {script}" for src, script in found if not (ROOT / script).is_file()})


@pytest.mark.skipif(not (ROOT / "benchmarks").is_dir(), reason="needs a source checkout")
def test_benchmark_commands_in_docs_name_existing_scripts():
    texts = _texts()
    commands = [(src, s) for src, text in texts.items() if src.endswith((".md", ".yaml")) for s in
                _BENCH_COMMAND.findall(text)]
    in_benchmarks_md = {s for src, s in commands if src == "docs/benchmarks.md"}
    assert len(in_benchmarks_md) >= 10, sorted(in_benchmarks_md)
    assert not _missing(commands), "commands naming no script:\n" + "\n".join(_missing(commands))
    mentions = [(src, s) for src, text in texts.items() for s in _BENCH_PATH.findall(text)]
    assert not _missing(mentions), "benchmarks/ scripts that are not there:\n" + "\n".join(_missing(mentions))


@pytest.mark.skipif(not (ROOT / "benchmarks").is_dir(), reason="needs a source checkout")
def test_committed_results_name_existing_scripts():
    found = []
    for path in (ROOT / "benchmarks" / "results").rglob("*.json"):
        for command in _RESULT_COMMAND.findall(path.read_text(encoding="utf-8")):
            found += [(str(path.relative_to(ROOT)), s) for s in _BENCH_PATH.findall(command)]
    assert len(found) >= 50
    assert not _missing(found), "results whose command names no script:\n" + "\n".join(_missing(found))
