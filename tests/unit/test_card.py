"""The skill card: valid against its strict schema and model, complete (every seed constraint), consistent,
and a malformed card fails with file, line and JSON path."""

import re
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from moe_overlap.skill.card import cards
from moe_overlap.skill.card.cards import CardError, CardFileError, get_card_field, load_card, load_card_file
from moe_overlap.skill.card.model import Card
from moe_overlap.skill.card.schemas import load_schema

SKILL = "perf-expert-parallel-overlap"
CARD = cards.card_path(SKILL)

# The shared contract (the constraints of Megatron-Core and Megatron-Bridge, then the four warnings), in this order.
SEED_IDS = [
    "ep-size-gt-1", "num-experts-gt-1", "dispatcher-alltoall-or-flex", "precision-bf16-or-fp16", "torch-min-2-6",
    "pp-requires-vpp", "no-full-recompute", "no-recompute-method", "no-recompute-num-layers",
    "no-moe-recompute-module", "no-shared-expert-overlap", "mtp-layers-limit", "cuda-graph-scope-excludes-moe",
    "ncclep-no-fc1-offload", "wgrad-requires-overlap", "wgrad-overlap-grad-reduce-te-2-7",
    "wgrad-grad-accum-fusion-te-2-7", "wgrad-cuda-graph-te-2-12", "flex-backend-needs-flex-dispatcher",
    "flex-backend-gpu-support",
    "cuda-device-max-connections", "ep-divides-experts", "wgrad-not-in-first-rollout", "single-micro-batch",
]
# flex-backend-needs-flex-dispatcher is a warning: the backend setting alone has no effect, it breaks nothing.
WARNINGS = {"cuda-device-max-connections", "ep-divides-experts", "wgrad-not-in-first-rollout", "single-micro-batch",
            "flex-backend-needs-flex-dispatcher"}

# Each constraint bullet of the seed document -> (rule id, config key or words its `requires`/`applies_when` names).
SEED_BULLETS = [
    ("expert_model_parallel_size > 1", "ep-size-gt-1", "expert_model_parallel_size"),
    ("num_moe_experts > 1", "num-experts-gt-1", "num_moe_experts"),
    ('moe_token_dispatcher_type must be "alltoall" or "flex"', "dispatcher-alltoall-or-flex", "alltoall, flex"),
    ("moe_shared_expert_overlap = False", "no-shared-expert-overlap", "moe_shared_expert_overlap"),
    ("base precision BF16 or FP16", "precision-bf16-or-fp16", "bf16"),
    ("PyTorch >= 2.6.0", "torch-min-2-6", "2.6.0"),
    ("if PP > 1, virtual_pipeline_model_parallel_size must be set", "pp-requires-vpp",
     "virtual_pipeline_model_parallel_size"),
    ('recompute_granularity != "full"', "no-full-recompute", "recompute_granularity"),
    ("recompute_method = None", "no-recompute-method", "recompute_method"),
    ("recompute_num_layers = None", "no-recompute-num-layers", "recompute_num_layers"),
    ("mtp_num_layers None or 1", "mtp-layers-limit", "mtp_num_layers"),
    ("delay_wgrad_compute requires overlap_moe_expert_parallel_comm", "wgrad-requires-overlap",
     "overlap_moe_expert_parallel_comm"),
    ("delay_wgrad_compute + overlap_grad_reduce needs TE >= 2.7.0", "wgrad-overlap-grad-reduce-te-2-7",
     "overlap_grad_reduce"),
    ("delay_wgrad_compute + gradient_accumulation_fusion needs TE >= 2.7.0", "wgrad-grad-accum-fusion-te-2-7",
     "gradient_accumulation_fusion"),
    ("CUDA graph scope attn + delay_wgrad_compute: TE >= 2.12.0, grad accum fusion, no attention bias",
     "wgrad-cuda-graph-te-2-12", "add_qkv_bias"),
    ("DeepEP: Ampere, Hopper, B200, B300 only", "flex-backend-gpu-support", "DeepEP"),
    ("HybridEP: Ampere, Hopper, B200, B300, GB200/GB300 NVL72", "flex-backend-gpu-support", "GB200/GB300"),
    ("setting moe_flex_dispatcher_backend alone does not activate flex", "flex-backend-needs-flex-dispatcher",
     '"flex"'),
]


@pytest.fixture(scope="module")
def card() -> Card:
    return load_card(SKILL)


@pytest.fixture(scope="module")
def raw() -> dict:
    return yaml.safe_load(CARD.read_text(encoding="utf-8"))


def test_card_validates_against_committed_schema(raw):
    errors = sorted(Draft202012Validator(load_schema("card.schema.json")).iter_errors(raw), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def _objects(node):
    if isinstance(node, dict):
        if node.get("type") == "object" and "properties" in node:
            yield node
        for v in node.values():
            yield from _objects(v)
    elif isinstance(node, list):
        for v in node:
            yield from _objects(v)


def test_card_schema_is_strict():
    schema = load_schema("card.schema.json")
    objects = list(_objects(schema))
    assert len(objects) > 15
    assert all(o.get("additionalProperties") is False for o in objects), [o.get("title") for o in objects]
    assert schema["additionalProperties"] is False


def test_schema_rejects_unknown_top_level_key(raw):
    bad = {**raw, "sumary": "typo"}
    assert any("sumary" in e.message for e in Draft202012Validator(load_schema("card.schema.json")).iter_errors(bad))


def test_seed_constraint_ids_come_first_in_contract_order(card):
    assert card.constraint_ids()[: len(SEED_IDS)] == SEED_IDS
    assert len(set(card.constraint_ids())) == len(card.constraint_ids())


def test_severities(card):
    for c in card.constraints[: len(SEED_IDS)]:
        assert c.severity == ("warning" if c.id in WARNINGS else "error"), c.id


@pytest.mark.parametrize("bullet,rule_id,needle", SEED_BULLETS, ids=[b[1] + ":" + b[2] for b in SEED_BULLETS])
def test_every_seed_constraint_is_in_the_card(card, bullet, rule_id, needle):
    c = card.constraint(rule_id)
    text = " ".join([c.applies_when, c.requires, c.message, c.fix, *c.config_keys])
    assert needle in text, f"seed constraint {bullet!r}: {rule_id} does not mention {needle!r}"


def test_min_versions(card):
    assert card.constraint("torch-min-2-6").min_versions == {"torch": "2.6.0"}
    assert card.constraint("wgrad-overlap-grad-reduce-te-2-7").min_versions == {"transformer_engine": "2.7.0"}
    assert card.constraint("wgrad-grad-accum-fusion-te-2-7").min_versions == {"transformer_engine": "2.7.0"}
    assert card.constraint("wgrad-cuda-graph-te-2-12").min_versions == {"transformer_engine": "2.12.0"}


def test_checked_by_matches_the_anchors(card):
    assert card.constraint("num-experts-gt-1").checked_by == ["megatron-bridge"]
    for rid in ("cuda-graph-scope-excludes-moe", "ncclep-no-fc1-offload"):
        assert card.constraint(rid).checked_by == ["megatron-core"]
    for rid in ("ep-size-gt-1", "dispatcher-alltoall-or-flex", "torch-min-2-6", "wgrad-requires-overlap"):
        assert set(card.constraint(rid).checked_by) == {"megatron-core", "megatron-bridge"}


def test_every_constraint_has_a_failure_mode_or_avoid_entry(card):
    covered = {r for f in card.failure_modes for r in f.rule_ids} | {r for a in card.avoid_when for r in a.rule_ids}
    assert set(SEED_IDS) <= covered, sorted(set(SEED_IDS) - covered)


def test_issue_fields_present(card):
    dims = card.training_dimensions.model_dump()
    assert set(dims) == {"speed", "memory", "scale", "convergence", "stability"}
    assert {m.evidence for m in card.expected_metric_change} == {"measured", "not_yet_measured"}
    assert card.minimal_example.config["comm_overlap"]["overlap_moe_expert_parallel_comm"] is True
    assert card.minimal_example.config["comm_overlap"]["delay_wgrad_compute"] is False
    assert [s.stage for s in card.recommended_path] == list(range(1, len(card.recommended_path) + 1))
    assert card.name == CARD.parent.name


def test_public_numbers_cite_the_anchor_sources(card):
    by_source = {}
    for m in card.expected_metric_change:
        by_source.setdefault(m.source, []).append(m.magnitude)
    assert any("41.25" in x and "31.31" in x for x in by_source["bridge-ep-overlap-skill"])
    assert any("287.3" in x for x in by_source["bridge-hybridep-skill"])
    assert any("+7.8%" in x and "+3.7%" in x for x in by_source["megatron-lm-pr-6311"])
    assert all(m.source for m in card.expected_metric_change if m.evidence == "measured")


def test_example_config_is_the_minimal_example(card):
    from moe_overlap.paths import examples_dir

    example = yaml.safe_load((examples_dir() / "ep-overlap-minimal.yaml").read_text())
    assert example == card.minimal_example.config


def test_get_card_field_paths():
    assert get_card_field(SKILL, "summary").startswith("Hide the expert-parallel")
    assert get_card_field(SKILL, "constraints.torch-min-2-6.min_versions.torch") == "2.6.0"
    assert get_card_field(SKILL, "constraints.0.id") == "ep-size-gt-1"
    assert get_card_field(SKILL, "failure_modes.no-speedup.rule_ids") == ["cuda-device-max-connections",
                                                                           "single-micro-batch"]
    assert get_card_field(SKILL, "")["name"] == SKILL


def test_unknown_field_lists_choices():
    with pytest.raises(CardError) as err:
        get_card_field(SKILL, "constraints.no-such-rule")
    assert "ep-size-gt-1" in err.value.choices
    with pytest.raises(CardError) as err:
        get_card_field(SKILL, "sumary")
    assert "summary" in err.value.choices
    with pytest.raises(CardError):
        get_card_field(SKILL, "summary.deeper")


def test_unknown_skill_lists_names():
    with pytest.raises(CardError) as err:
        load_card("no-such-skill")
    assert SKILL in err.value.choices


def test_list_skills():
    skills = cards.list_skills()
    mine = next(s for s in skills if s.name == SKILL)
    assert mine.summary and mine.validation_status == "config-rules-checked"


# ---- malformed cards: file, line and JSON path --------------------------------------------------------

def _write_variant(tmp_path: Path, old: str, new: str, count: int = 1) -> Path:
    text = CARD.read_text(encoding="utf-8")
    assert old in text, old
    path = tmp_path / "card.yaml"
    path.write_text(text.replace(old, new, count), encoding="utf-8")
    return path


def _line_of(path: Path, needle: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if needle in line)


def test_yaml_syntax_error_has_line(tmp_path):
    path = tmp_path / "card.yaml"
    path.write_text("name: x\nsummary: ok\nconstraints: [a, b\nevidence: []\n")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    (p,) = err.value.problems
    assert p.file == str(path) and p.line is not None and p.line >= 3 and "YAML syntax error" in p.message


def test_unknown_key_points_at_the_key(tmp_path):
    path = _write_variant(tmp_path, "  - id: pp-requires-vpp\n", "  - id: pp-requires-vpp\n    severty: error\n")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    (p,) = err.value.problems
    assert p.path == "$.constraints[5].severty"
    assert p.line == _line_of(path, "severty:")
    assert f"{path}:{p.line}" in str(err.value)


def test_bad_enum_value_has_path_and_line(tmp_path):
    path = _write_variant(tmp_path, "    family: mtp\n", "    family: multi-token\n")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    (p,) = err.value.problems
    assert p.path == "$.constraints[11].family" and p.line == _line_of(path, "family: multi-token")


def test_missing_required_field(tmp_path):
    path = _write_variant(tmp_path, "    fix: Set expert_model_parallel_size > 1, or turn the overlap off.\n", "")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    assert any(p.path == "$.constraints[0]" and "fix" in p.message for p in err.value.problems)


def test_unknown_rule_id_in_failure_mode(tmp_path):
    path = _write_variant(tmp_path, "rule_ids: [ep-divides-experts]", "rule_ids: [ep-divides-expertz]")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    (p,) = err.value.problems
    assert p.path.endswith(".rule_ids[0]") and "ep-divides-expertz" in p.message
    assert p.line == _line_of(path, "ep-divides-expertz")


def test_unknown_evidence_id(tmp_path):
    path = _write_variant(tmp_path, "    source: deepep-docs\n", "    source: deepep-doc\n")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    assert any("deepep-doc" in p.message and p.line == _line_of(path, "source: deepep-doc") for p in
               err.value.problems)


def test_duplicate_yaml_key(tmp_path):
    path = _write_variant(tmp_path, "title: MoE", "title: first\ntitle: MoE")
    with pytest.raises(CardFileError) as err:
        load_card_file(path)
    (p,) = err.value.problems
    assert p.path == "$.title" and p.message == "duplicate key" and p.line == _line_of(path, "title: MoE")


# ---- the docs the card points to ---------------------------------------------------------------------

def test_references_exist(card):
    from moe_overlap.paths import data_root

    assert (CARD.parent / card.references.skill_md).is_file()
    assert (CARD.parent / card.references.docs).is_file()
    assert (data_root() / card.references.schema_file).is_file()


def test_own_code_anchors_exist(card):
    root = Path(cards.__file__).resolve().parents[3]
    if not (root / "moe_overlap").is_dir() or not (root / "pyproject.toml").is_file():
        pytest.skip("not a checkout")
    for anchor in card.code_anchors:
        if anchor.repo == "this package":
            assert (root / anchor.path).is_file(), anchor.path


def _constraint_doc(card) -> str:
    """The stable reference doc and its continuation pages (constraints.md links constraints-wgrad-flex.md: the
    table is split so that no page an assistant reads grows past ~7,000 characters)."""
    path = CARD.parent / card.references.docs
    parts = [path, *sorted(path.parent.glob(f"{path.stem}-*.md"))]
    assert all(f"]({p.name})" in path.read_text(encoding="utf-8") for p in parts[1:]), parts
    return "\n".join(p.read_text(encoding="utf-8") for p in parts)


def test_stable_doc_names_every_constraint_and_the_references_tell_how_to_measure(card):
    doc = _constraint_doc(card)
    assert [rid for rid in card.constraint_ids() if f"`{rid}`" not in doc] == []
    measuring = (CARD.parent / "references" / "measuring.md").read_text(encoding="utf-8")
    assert "## How to measure overlap honestly" in measuring and "exposed" in measuring and "sum" in measuring


def test_generated_reference_tables_are_fresh():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, str(root / "tools" / "gen_skill_refs.py"), "--check"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_troubleshooting_rows_are_card_failure_modes(card):
    from moe_overlap.paths import docs_dir

    text = (docs_dir() / "troubleshooting.md").read_text(encoding="utf-8")
    names = {f.name for f in card.failure_modes}
    cited = set(re.findall(r"\| `([a-z0-9-]+)` \|", text))
    assert cited and cited <= names, sorted(cited - names)


# ---- CLI: moe-overlap card ---------------------------------------------------------------------------

def test_cli_card_field_text(capsys):
    from moe_overlap.cli import main

    assert main(["card", SKILL, "--field", "constraints.torch-min-2-6.requires"]) == 0
    assert capsys.readouterr().out.strip() == "torch >= 2.6.0"


def test_cli_card_field_json_and_yaml(capsys):
    import json

    from moe_overlap.cli import main

    assert main(["card", SKILL, "--field", "constraints.ep-size-gt-1", "--format", "json"]) == 0
    read = json.loads(capsys.readouterr().out)  # what get_skill_card returns over MCP
    assert read["field"] == "constraints.ep-size-gt-1" and "megatron-core" in read["value"]["checked_by"]
    assert read["next_step"].startswith("for one entry, run `moe-overlap card ")
    assert main(["card", SKILL, "--section", "constraints", "--field", "ep-size-gt-1.severity", "--format",
                 "json"]) == 0
    assert json.loads(capsys.readouterr().out)["value"] == "error"
    assert main(["card", SKILL, "--field", "minimal_example.config", "--format", "yaml"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["model"]["moe_token_dispatcher_type"] == "alltoall"


def test_cli_card_overview_and_list(capsys):
    import json

    from moe_overlap.cli import main

    assert main(["card", SKILL]) == 0
    out = capsys.readouterr().out
    assert "wgrad-cuda-graph-te-2-12" in out and "failure modes:" in out
    assert main(["card", "--format", "json"]) == 0
    assert SKILL in [s["name"] for s in json.loads(capsys.readouterr().out)["skills"]]
    assert main(["card", SKILL, "--format", "json"]) == 0  # the contents, as get_skill_card gives them
    contents = json.loads(capsys.readouterr().out)["contents"]
    assert "ep-size-gt-1" in next(s for s in contents["sections"] if s["section"] == "constraints")["entries"]


def test_cli_card_unknown_name_and_field_exit_2(capsys):
    from moe_overlap.cli import main

    assert main(["card", "no-such-skill"]) == 2
    err = capsys.readouterr().err
    assert "unknown skill" in err and SKILL in err
    assert main(["card", SKILL, "--field", "constraints.nope"]) == 2
    err = capsys.readouterr().err
    assert "valid choices" in err and "ep-size-gt-1" in err


def test_minimal_example_is_valid_for_the_validator(card):
    from moe_overlap.skill.rules.validate import validate_config

    result = validate_config(card.minimal_example.config, torch_version="2.6.0")
    assert result.valid, [f.rule for f in result.findings]


def _severity_by_table(text: str) -> dict[str, str]:
    """rule id -> 'error'/'warning' as the prose tables present it: SKILL.md by the line above each table
    ('... (errors ...' or 'Warnings ...'), the training doc by its severity column."""
    found, heading = {}, None
    for line in text.splitlines():
        if not line.startswith("|"):
            heading = ("warning" if line.startswith("Warnings") else "error" if "(errors" in line else None) \
                if line.strip() else heading
            continue
        m = re.match(r"\| `([a-z0-9-]+)` \|", line)
        column = re.search(r"\| (error|warning) \|", line)
        if m and (column or heading):
            found[m.group(1)] = column.group(1) if column else heading
    return found


def test_reference_table_gives_each_rule_the_card_severity_and_releases(card):
    doc = _constraint_doc(card)
    shown = _severity_by_table(doc)
    severity = {c.id: c.severity for c in card.constraints}
    assert set(severity) <= set(shown), sorted(set(severity) - set(shown))
    wrong = {i: (shown[i], severity[i]) for i in severity if shown[i] != severity[i]}
    assert not wrong, wrong
    releases = {}
    for line in doc.splitlines():
        cols = [c.strip() for c in line.strip("|").split(" | ")]
        if line.startswith("| `") and len(cols) == 6:
            releases[cols[0].strip("`")] = cols[4]
    assert {c.id: c.releases for c in card.constraints} == releases


def test_constraint_releases_upstream_and_checkers_match_the_rules(card):
    """The card states, per constraint, the release lines and upstream lines the validator's rule uses, and who
    enforces it (Core / Megatron-LM / Bridge / this skill's advice)."""
    from moe_overlap.skill.rules.registry import all_rules

    for rule in all_rules():
        c = card.constraint(rule.id)
        assert c.releases == rule.releases(), rule.id
        # The upstream lines are the rules' own (references/upstream-lines.md is generated from them): not restated.
        assert c.upstream is None, rule.id
        kinds = {rule.kind(line) for line in ((0, 16), (0, 17), (0, 18), (0, 19)) if rule.applies_to(line)}
        checkers = set(c.checked_by)
        assert ("megatron-bridge" in checkers) == rule.bridge, rule.id
        if "arguments.py" in rule.source and rule.severity == "error":
            assert "megatron-lm" in checkers, rule.id
        if kinds & {"core", "runtime"} and "arguments.py" not in rule.source:
            assert "megatron-core" in checkers, rule.id
        if kinds == {"advice"}:
            assert checkers <= {"moe-overlap", "megatron-core"}, rule.id


def test_cli_card_field_without_name_reads_the_only_skill(capsys):
    from moe_overlap.cli import main

    assert main(["card", "--field", "summary"]) == 0
    assert capsys.readouterr().out.strip() == load_card(SKILL).summary
    assert main(["card", "--section", "constraints", "--field", "torch-min-2-6.requires"]) == 0
    assert capsys.readouterr().out.strip() == "torch >= 2.6.0"


def test_cli_card_field_without_name_needs_one_when_several(capsys, monkeypatch):
    from moe_overlap.cli import main

    monkeypatch.setattr(cards, "skill_names", lambda: [SKILL, "another-skill"])
    assert main(["card", "--field", "summary"]) == 2
    err = capsys.readouterr().err
    assert "need a skill name" in err and "another-skill" in err
