"""SKILL.md: valid Agent Skills format, and it carries what the card and the seed require."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moe_overlap.skill.card.cards import load_card, read_frontmatter, skill_dir

SKILL = "perf-expert-parallel-overlap"
FOLDER = skill_dir(SKILL)
SKILL_MD = FOLDER / "SKILL.md"
TEXT = SKILL_MD.read_text(encoding="utf-8")
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata"}
MCP_TOOLS = ["list_skills", "get_skill_card", "validate_config", "generate_config", "run_verification",
             "check_training_log", "diagnose_failure", "estimate_overlap_benefit"]
CLI = ["moe-overlap validate", "moe-overlap generate", "moe-overlap verify", "moe-overlap check-logs",
       "moe-overlap diagnose", "moe-overlap estimate", "moe-overlap card"]


def _agentskills() -> str | None:
    local = Path(sys.executable).parent / "agentskills"
    return str(local) if local.exists() else shutil.which("agentskills")


def _section(title: str) -> str:
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", TEXT, flags=re.M | re.S)
    assert match, f"SKILL.md has no '## {title}' section"
    return match.group(1)


@pytest.mark.skipif(_agentskills() is None, reason="skills-ref (agentskills) not installed")
def test_agentskills_validate_passes():
    proc = subprocess.run([_agentskills(), "validate", str(FOLDER)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_frontmatter_keys_and_name():
    front = read_frontmatter(SKILL_MD)
    assert set(front) <= ALLOWED_KEYS and {"name", "description"} <= set(front)
    assert front["name"] == FOLDER.name == SKILL
    assert len(front["description"]) <= 1024 and len(front.get("compatibility", "")) <= 500
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in front["metadata"].items())


def test_body_under_500_lines_and_english():
    body = TEXT.split("\n---", 1)[1]
    assert len(body.splitlines()) < 500
    # The seed was French: none of its words may survive the translation.
    for word in ("Décision", "chevauchement", "Vérification", "Évitez", "Limitations Connues"):
        assert word not in TEXT


def test_every_constraint_id_is_named():
    missing = [rid for rid in load_card(SKILL).constraint_ids() if f"`{rid}`" not in TEXT]
    assert not missing


def test_failure_table_has_a_row_per_failure_mode():
    table = _section("Failure diagnosis")
    header = next(line for line in table.splitlines() if line.startswith("| symptom"))
    assert [c.strip() for c in header.strip("|").split("|")] == ["symptom", "likely cause", "how to confirm", "fix"]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| symptom")]
    for fm in load_card(SKILL).failure_modes:
        assert any(f"(`{fm.name}`)" in row for row in rows), fm.name
        row = next(r for r in rows if f"(`{fm.name}`)" in r)
        assert len(row.strip("|").split(" | ")) == 4, row
        for rid in fm.rule_ids:
            assert f"`{rid}`" in row, (fm.name, rid)


def test_tests_section_is_filled():
    tests = _section("Tests")
    assert tests.count("tests/unit/") >= 4 and "python -m pytest" in tests


def test_seed_sections_present():
    for title in ("Description", "Quick decision", "Activation", "Compatibility and constraints",
                  "Minimal working configuration", "Minimal runnable commands", "Verification", "Code anchors",
                  "Tests", "Failure diagnosis", "Known limitations"):
        _section(title)
    assert "apply_flex_dispatcher_backend" in _section("Activation")
    assert "setup_experiment.py" in _section("Minimal runnable commands")
    assert "test_comm_overlap.py" in _section("Verification")


def test_own_commands_come_before_upstream():
    commands = _section("Minimal runnable commands")
    for tool in MCP_TOOLS:
        assert tool in commands, tool
    for cli in CLI:
        assert cli in commands, cli
    assert commands.index("moe-overlap ") < commands.index("setup_experiment.py")
