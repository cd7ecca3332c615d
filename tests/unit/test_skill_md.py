"""The skill folder: valid Agent Skills format, SKILL.md a short router, complete when copied alone (every link and
every file path it tells its reader to open resolves inside the copy), and it carries the corrected statements."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from moe_overlap.skill.card.cards import load_card, read_frontmatter, skill_dir

SKILL = "perf-expert-parallel-overlap"
FOLDER = skill_dir(SKILL)
SKILL_MD = FOLDER / "SKILL.md"
TEXT = SKILL_MD.read_text(encoding="utf-8")
REFERENCES = sorted((FOLDER / "references").glob("*.md"))
ALL_TEXT = TEXT + "\n".join(p.read_text(encoding="utf-8") for p in REFERENCES)
ALLOWED_KEYS = {"name", "description", "license", "compatibility", "metadata"}
MCP_TOOLS = ["list_skills", "get_skill_card", "validate_config", "generate_config", "run_verification",
             "check_training_log", "diagnose_failure", "estimate_overlap_benefit"]
CLI = ["moe-overlap validate", "moe-overlap generate", "moe-overlap verify", "moe-overlap check-logs",
       "moe-overlap diagnose", "moe-overlap estimate", "moe-overlap card"]
# Paths of upstream repositories the text cites (read on GitHub or in the wheels), not files of this folder.
UPSTREAM = ("megatron/", "src/megatron/", "scripts/performance/", "tests/unit_tests/")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_PATH = re.compile(r"(?<![\w/.-])((?:[\w.-]+/)+[\w.-]+\.(?:md|ya?ml|json|log|txt|py))(?![\w/])")


def _agentskills() -> str | None:
    local = Path(sys.executable).parent / "agentskills"
    return str(local) if local.exists() else shutil.which("agentskills")


def _copy_alone(tmp_path: Path) -> Path:
    """The skill folder copied into an otherwise empty directory, as an installer would."""
    dest = tmp_path / "installed-skills" / SKILL
    shutil.copytree(FOLDER, dest, symlinks=True)
    return dest


def _slug(heading: str) -> str:
    text = re.sub(r"[^\w\s-]", "", heading.strip().lower())
    return re.sub(r"\s", "-", text)


def _anchors(path: Path) -> set[str]:
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", path.read_text(encoding="utf-8"), flags=re.M)}


def _references(root: Path) -> list[tuple[Path, str, str]]:
    """(file, kind, target) for every relative link and path-like reference in the folder's Markdown and assets."""
    found = []
    texts = [root / "SKILL.md", *sorted((root / "references").glob("*.md")), *sorted((root / "assets").glob("*"))]
    for path in texts:
        text = path.read_text(encoding="utf-8")
        for target in _LINK.findall(text):
            if not re.match(r"^[a-z]+:", target):
                found.append((path, "link", target))
        for target in _PATH.findall(_LINK.sub("", text)):
            if not target.startswith(UPSTREAM) and not re.match(r"^[a-z]+:", target):
                found.append((path, "path", target))
    card = yaml.safe_load((root / "card.yaml").read_text(encoding="utf-8"))
    for key in ("skill_md", "docs"):
        found.append((root / "card.yaml", "card reference", card["references"][key]))
    return found


@pytest.mark.skipif(_agentskills() is None, reason="skills-ref (agentskills) not installed")
def test_agentskills_validate_passes_in_place_and_copied_alone(tmp_path):
    for folder in (FOLDER, _copy_alone(tmp_path)):
        proc = subprocess.run([_agentskills(), "validate", str(folder)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_link_and_path_resolves_inside_a_lone_copy(tmp_path):
    root = _copy_alone(tmp_path)
    assert not [p for p in root.rglob("*") if p.is_symlink()], "a symlink would dangle in a copy"
    refs = _references(root)
    assert len(refs) >= 25, refs  # the router really points somewhere
    broken = []
    for source, kind, target in refs:
        file_part, _, anchor = target.partition("#")
        base = root if kind in ("path", "card reference") and not file_part.startswith(".") else source.parent
        resolved = (base / file_part).resolve() if file_part else source
        if not resolved.is_relative_to(root.resolve()) or not resolved.exists():
            # A bare path in prose may be relative to the folder root or to the file that names it.
            alt = (source.parent / file_part).resolve()
            if not (alt.is_relative_to(root.resolve()) and alt.exists()):
                broken.append((source.name, kind, target))
                continue
            resolved = alt
        if anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append((source.name, "anchor", target))
    assert not broken, broken


def test_nothing_points_outside_the_folder():
    for source, _kind, target in _references(FOLDER):
        assert not target.startswith(("../../", "/", "docs/", "examples/")), (source.name, target)


def test_frontmatter_keys_and_name():
    front = read_frontmatter(SKILL_MD)
    assert set(front) <= ALLOWED_KEYS and {"name", "description"} <= set(front)
    assert front["name"] == FOLDER.name == SKILL
    assert len(front["description"]) <= 1024 and len(front.get("compatibility", "")) <= 500
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in front["metadata"].items())
    assert (FOLDER / front["metadata"]["card"]).is_file() and (FOLDER / front["metadata"]["reference"]).is_file()


def test_description_says_when_not_to_use():
    description = read_frontmatter(SKILL_MD)["description"]
    assert "Use when" in description and "Not for" in description
    for neighbour in ("tp_comm_overlap", "overlap_grad_reduce", "pipeline", "context-parallel", "FP8"):
        assert neighbour in description
    assert "does **not** apply" in TEXT


def test_skill_md_is_a_short_router():
    """Every question reads SKILL.md in full, so it holds the frontmatter and the router only (issue 30: on average
    <= 12k characters of skill material per question); the workflow and the tool list live in references/tools.md."""
    assert len(TEXT.splitlines()) < 150
    assert len(TEXT) <= 4_100, len(TEXT)
    for ref in REFERENCES:
        assert f"references/{ref.name}" in TEXT, ref.name
    for title in ("When it applies, and when it does not", "Find the answer: one page per task"):
        assert f"## {title}" in TEXT
    tools = (FOLDER / "references" / "tools.md").read_text(encoding="utf-8")
    assert "## Workflow" in tools and "## Files in this folder" in tools


# The user's tasks the router must send somewhere (issue 30): each row names one page or one command.
TASKS = ("enable it", "start-up failure", "hang", "memory", "will pay", "CUDA graphs", "flex dispatcher",
         "release")


def test_router_sends_each_task_to_one_short_page():
    section = TEXT.split("## Find the answer: one page per task", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| the user")]
    for task in TASKS:
        row = next((r for r in rows if task in r), None)
        assert row is not None, task
        pages = set(re.findall(r"\]\((references/[\w.-]+\.md)", row.split(" | ")[1]))
        assert len(pages) >= 1, row
    routed = {p for r in rows for p in re.findall(r"\]\((references/[\w.-]+\.md)", r)}
    assert routed == {f"references/{p.name}" for p in REFERENCES}, "every reference page is reachable from the router"


def test_no_reference_page_over_7k_characters():
    """The one page a question lands on stays short (split a page by sub-task rather than let it grow)."""
    sizes = {p.name: len(p.read_text(encoding="utf-8")) for p in REFERENCES}
    assert len(sizes) >= 8 and max(sizes.values()) <= 7_000, sizes


def test_every_page_answers_first():
    """Each page opens with its title and a short summary that answers the common question, details after."""
    for page in REFERENCES:
        text = page.read_text(encoding="utf-8")
        assert text.startswith("# "), page.name
        first = text.split("\n\n", 2)[1]
        assert first.startswith("**In short.**") and len(first) <= 1_000, (page.name, first[:80])


def test_english_only():
    for word in ("Décision", "chevauchement", "Vérification", "Évitez", "Limitations Connues"):
        assert word not in ALL_TEXT


def test_every_constraint_id_is_named_in_the_references():
    missing = [rid for rid in load_card(SKILL).constraint_ids() if f"`{rid}`" not in ALL_TEXT]
    assert not missing


def test_failure_table_has_a_row_per_failure_mode():
    """Every failure mode of the card has its row (symptom, cause, confirm, fix) on exactly one task page, and the
    index (failure-diagnosis.md) sends its name to that page."""
    index = (FOLDER / "references" / "failure-diagnosis.md").read_text(encoding="utf-8")
    names = {fm.name for fm in load_card(SKILL).failure_modes}
    rows = {}
    for page in REFERENCES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.search(r"\(`([a-z0-9-]+)`\) \|", line)
            if m and line.startswith("| ") and m.group(1) in names:
                header = next(h for h in reversed(lines[:i]) if h.startswith("| symptom"))
                assert [c.strip() for c in header.strip("|").split("|")] == ["symptom", "likely cause",
                                                                            "how to confirm", "fix"]
                rows.setdefault(m.group(1), []).append((page.name, line))
    for fm in load_card(SKILL).failure_modes:
        assert len(rows.get(fm.name, [])) == 1, (fm.name, [p for p, _ in rows.get(fm.name, [])])
        page, row = rows[fm.name][0]
        assert len(re.split(r"(?<!\\)\|", row.strip().strip("|"))) == 4, row
        for rid in fm.rule_ids:
            assert f"`{rid}`" in row, (fm.name, rid)
        entry = next((r for r in index.splitlines() if f"`{fm.name}`" in r), None)
        assert entry is not None and f"]({page}" in entry, (fm.name, page)


def test_seed_topics_are_covered():
    activation = (FOLDER / "references" / "activation.md").read_text(encoding="utf-8")
    assert "apply_flex_dispatcher_backend" in activation and "setup_experiment.py" in activation
    headings = {
        "communication-overlap.md": ("## Mechanism", "### Delayed weight gradients"),
        "measuring.md": ("## Reading the run", "## How to measure overlap honestly"),
        "will-it-pay.md": ("## Public results and their conditions",),
        "constraints.md": ("# Constraints",),
    }
    for page, titles in headings.items():
        text = (FOLDER / "references" / page).read_text(encoding="utf-8")
        for title in titles:
            assert title in text, (page, title)
    assert "test_comm_overlap.py" in (FOLDER / "references" / "measuring.md").read_text(encoding="utf-8")


def test_own_tools_are_listed():
    tools = (FOLDER / "references" / "tools.md").read_text(encoding="utf-8")
    for tool in MCP_TOOLS:
        assert tool in tools, tool
    for cli in CLI:
        assert cli in tools, cli


# ---- statements issue 20 found wrong, and the guidance it found missing ---------------------------------------

def test_perf_harness_command_uses_the_scripts_real_flags():
    rollout = (FOLDER / "references" / "rollout.md").read_text(encoding="utf-8")
    command = re.search(r"python scripts/performance/setup_experiment\.py(.*?)\n```", rollout, re.S).group(1)
    for flag in ("-m qwen", "-mr qwen3_30b_a3b", "-g h100", "-ng 16", "--moe_a2a_overlap true"):
        assert flag in command, flag
    harness = re.findall(r"setup_experiment\.py[^\n]*", ALL_TEXT + load_card(SKILL).minimal_example.upstream_command)
    assert harness
    for wrong in ("--model ", "--num_nodes"):
        assert not [line for line in harness if wrong in line], wrong
    assert "--num_nodes" not in ALL_TEXT
    assert "also turns delayed wgrad on" in load_card(SKILL).minimal_example.upstream_command


def test_public_figures_carry_their_conditions():
    assert "SFT" not in ALL_TEXT  # the Qwen3 figures come from mock-data pretraining
    reference = (FOLDER / "references" / "will-it-pay.md").read_text(encoding="utf-8")
    row = next(line for line in reference.splitlines() if "41.25 s" in line)
    assert "mock-data pretraining" in row and "CUDA graphs off" in row
    assert "13% slower" in reference and "4.8% slower" in reference
    card = load_card(SKILL)
    assert any("13% slower" in m.magnitude for m in card.expected_metric_change)
    assert all("SFT" not in m.conditions for m in card.expected_metric_change)


def test_bridge_comm_overlap_none_gpt_model_and_forward_step():
    activation = (FOLDER / "references" / "activation.md").read_text(encoding="utf-8")
    summary = activation.split("\n## ", 1)[0]  # the answer an assistant reads first
    assert "CommOverlapConfig(tp_comm_overlap=False)" in activation and "comm_overlap=None" in summary
    assert "AttributeError" in activation and "GPTModel" in activation and "return_schedule_plan" in activation
    assert "GPTModel" in summary and "return_schedule_plan" in summary


def test_environment_recompute_flex_and_te_layer_guidance():
    activation = (FOLDER / "references" / "activation.md").read_text(encoding="utf-8")
    summary = activation.split("\n## ", 1)[0]
    assert "32" in summary and "before CUDA initialises" in summary
    assert "0.19.2" in summary and "ep_overlap_early_attn_memory_release" in summary  # full recompute, by version
    assert "ValueError" in ALL_TEXT and "Falling back to alltoall" in ALL_TEXT
    assert "Transformer Engine layers" in summary
    reference = (FOLDER / "references" / "memory.md").read_text(encoding="utf-8")
    assert "PR 6311" in reference and "no release has it yet" in reference
