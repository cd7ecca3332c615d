"""One source for every fact: the versions, GPU lists and rule ranges that SKILL.md, card.yaml and references/ quote
agree with the rules (moe_overlap/skill/rules/), which are run to find them (tests/unit/skill_facts.py). A quote
that disagrees fails here; each check is also shown to fail on a planted error."""

import re

import pytest
import yaml

from moe_overlap.skill.card.cards import load_card, read_frontmatter, skill_dir
from tests.unit import skill_facts as facts

SKILL = "perf-expert-parallel-overlap"
FOLDER = skill_dir(SKILL)
SKILL_MD = FOLDER / "SKILL.md"
PAGES = sorted((FOLDER / "references").glob("*.md"))


def _texts():
    yield "SKILL.md", SKILL_MD.read_text(encoding="utf-8")
    for page in PAGES:
        yield page.name, page.read_text(encoding="utf-8")
    yield from facts.strings(yaml.safe_load((FOLDER / "card.yaml").read_text(encoding="utf-8")))


def test_the_rules_give_the_facts():
    """The probes really run the rules (a probe that never fires fails inside version_minimums)."""
    mins = facts.version_minimums()
    assert mins["torch-min-2-6"] == ("torch", "2.6.0") and mins["wgrad-te-min-2-3"] == ("te", "2.3.0")
    assert facts.te_minimums() >= {(2, 3), (2, 7), (2, 8), (2, 10), (2, 12)}
    assert facts.gpu_support()["hybridep"][0] == {8, 9, 10}
    assert "GB200" in facts.gpu_support()["hybridep"][1] and "GB200" not in facts.gpu_support()["deepep"][1]
    assert facts.mtp_allowed()["0.19"] == {None, 0, 1} and facts.mtp_allowed()["0.16"] == {None, 1}


def test_every_quoted_version_gpu_list_and_range_agrees_with_the_rules():
    problems = [p for where, text in _texts() for p in facts.all_problems(text, where)]
    assert not problems, "\n".join(problems)


def header_problems(compatibility: str) -> list[str]:
    """SKILL.md's compatibility line: torch's minimum, every TE minimum, and the lowest TE version is the base."""
    quoted = [facts._mm(v) for v in re.findall(r"\b(\d+\.\d+\.\d+)\b", compatibility)]
    torch = [facts._mm(v) for pkg, v in facts.version_minimums().values() if pkg == "torch"]
    te = facts.te_minimums()
    problems = [f"TE {a}.{b} missing" for a, b in sorted(te - set(quoted))]
    problems += [f"torch {a}.{b} missing" for a, b in torch if (a, b) not in quoted]
    te_quoted = [q for q in quoted if q in te]
    if te_quoted and te_quoted[0] != min(te):
        problems.append(f"the first TE version given is {te_quoted[0]}, the base minimum is {min(te)}")
    return problems


def test_compatibility_header_lists_every_minimum_base_first():
    assert header_problems(read_frontmatter(SKILL_MD)["compatibility"]) == []


def test_card_min_versions_are_the_rules():
    card = load_card(SKILL)
    for rule_id, (package, version) in facts.version_minimums().items():
        key = "torch" if package == "torch" else "transformer_engine"
        assert card.constraint(rule_id).min_versions == {key: version}, rule_id
    with_versions = {c.id for c in card.constraints if set(c.min_versions) & {"torch", "transformer_engine"}}
    assert with_versions <= set(facts.VERSION_RULES), sorted(with_versions - set(facts.VERSION_RULES))


def test_version_table_gives_each_rule_its_minimum():
    page = (FOLDER / "references" / "delayed-wgrad.md").read_text(encoding="utf-8")
    rows = {m.group(2): m.group(1) for m in re.finditer(r"\| (?:TE|torch) (\d+\.\d+\.\d+) \| `([a-z0-9-]+)` \|", page)}
    assert rows == {rid: v for rid, (_pkg, v) in facts.version_minimums().items()}


def test_gpu_support_section_states_each_backend_in_full():
    page = (FOLDER / "references" / "flex-dispatchers.md").read_text(encoding="utf-8")
    section = page.split("## GPU support", 1)[1].split("\n## ", 1)[0]
    for backend, (majors, _names) in facts.gpu_support().items():
        label = facts.BACKENDS[backend][0]
        bullet = next(b for b in section.split("\n- ") if b.startswith(f"**{label}**"))
        claimed = bullet.split("Not ", 1)[0]
        assert {int(x) for x in re.findall(r"(\d+)\.x", claimed)} == majors, (backend, bullet)


def test_each_pull_request_is_one_evidence_entry():
    seen = {}
    for e in load_card(SKILL).evidence:
        for pr in set(re.findall(r"(?:PR |/pull/)(\d+)", " ".join([e.title, e.where, e.note or ""]))):
            assert pr not in seen, f"PR {pr} is cited by evidence {seen[pr]!r} and {e.id!r}"
            seen[pr] = e.id


def test_cuda_graph_rename_names_field_and_flags():
    page = (FOLDER / "references" / "cuda-graphs.md").read_text(encoding="utf-8")
    for name in ("`cuda_graph_scope`", "`cuda_graph_modules`", "`--cuda-graph-scope`", "`--cuda-graph-modules`"):
        assert name in page, name
    key = next(k for k in load_card(SKILL).config_keys if k.key == "model.cuda_graph_scope")
    assert "--cuda-graph-scope" in key.megatron_lm_flag and "--cuda-graph-modules" in key.megatron_lm_flag


# ---- the checks fail on planted errors ---------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "DeepEP runs on GB200 NVL72 racks.",
    "HybridEP needs compute capability 8.x, 9.x, 10.x or 12.x.",
    "NCCL EP (ncclep) works on Ampere and Hopper.",
    "DeepEP on 8.x/9.x/10.x.",
    "HybridEP is not available on B200.",
])
def test_gpu_check_catches(text):
    assert facts.gpu_problems(text, "planted")


@pytest.mark.parametrize("text", [
    "Delayed wgrad needs TE >= 2.9.0 with overlap_grad_reduce.",
    "Transformer Engine 2.11 inside a graph scope.",
    "The overlap hangs with torch < 2.5.",
])
def test_version_check_catches(text):
    assert facts.version_problems(text, "planted")


@pytest.mark.parametrize("text", [
    "mtp_num_layers must be None, 1 or 2 with the overlap.",
    "mtp_num_layers in {None, 0, 1}",
])
def test_mtp_check_catches(text):
    assert facts.mtp_problems(text, "planted")


def test_release_cell_check_catches():
    assert facts.release_cell_problems("| `mtp-requires-pp` | x | y | error | 0.16-0.19 | Core |", "planted")
    assert not facts.release_cell_problems("| `mtp-requires-pp` | x | y | error | 0.16-0.17 | Core |", "planted")


def test_header_check_catches_the_old_header():
    old = ("Megatron-Core 0.16-0.19, PyTorch >= 2.6. Delayed wgrad needs Transformer Engine layers (TE >= 2.7; 2.8 "
           "under Megatron-LM with overlap_grad_reduce; 2.12 inside CUDA graphs).")
    assert header_problems(old)
    assert not facts.gpu_problems("HybridEP on 8.x, 9.x or 10.x (GB200/GB300 NVL72 included); NCCL EP on 9.x.", "ok")


def test_eval_ground_truths_agree_with_the_rules_on_gpus_and_ranges():
    """The evals grade answers against their ground truth, so a wrong GPU list or range there would mis-grade.
    (Versions are not checked here: a ground truth may restate the user's own, e.g. 'TE 2.9 fails'.)"""
    import json

    data = json.loads((FOLDER / "evals" / "evals.json").read_text(encoding="utf-8"))
    problems = [p for case in data["evals"] for text in [case["ground_truth"], *case["expectations"]]
                for p in facts.gpu_problems(text, f"eval {case['id']}") + facts.mtp_problems(text, f"eval {case['id']}")]
    assert not problems, "\n".join(problems)
