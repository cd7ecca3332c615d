"""The notes a result carries about what matters next (moe_overlap/skill/rules/notes.py): which configs get which,
that every source resolves, and that the facts they state are where they say (upstream code, the card's evidence)."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from moe_overlap.cli import main
from moe_overlap.paths import skills_dir
from moe_overlap.skill.generate.api import generate_config
from moe_overlap.skill.generate.model import GenerateRequest
from moe_overlap.skill.rules.notes import NOTES
from moe_overlap.skill.rules.registry import rules_for
from moe_overlap.skill.rules.validate import validate_config
from moe_overlap.skill.rules.versions import KNOWN_CORE_RELEASES
from tests.oracle import releases

CARD = yaml.safe_load((skills_dir() / "perf-expert-parallel-overlap" / "card.yaml").read_text(encoding="utf-8"))
OVERLAP_NOTES = ["memory-extra-micro-batch", "micro-batches", "cuda-device-max-connections", "eval-forward-only",
                 "delayed-wgrad-measured", "verify-next"]
ENV = dict(torch_version="2.6.0", te_version="2.7.0", gpu="H100", env={"CUDA_DEVICE_MAX_CONNECTIONS": "32"},
           detect=False)


def _config(**model):
    base = {"expert_model_parallel_size": 8, "num_moe_experts": 64, "moe_token_dispatcher_type": "alltoall",
            "bf16": True}
    return {"model": base | model, "comm_overlap": {"overlap_moe_expert_parallel_comm": True}}


def test_every_note_source_resolves():
    rule_ids = {r.id for line in KNOWN_CORE_RELEASES for r in rules_for(line)}
    evidence = {e["id"] for e in CARD["evidence"]}
    root = skills_dir().parent
    for note in NOTES:
        kind, _, ref = note.source.partition(":")
        assert (kind == "rule" and ref in rule_ids) or (kind == "evidence" and ref in evidence) or (
            kind == "doc" and (root / ref).is_file()), note


def test_a_valid_overlap_config_carries_the_overlap_notes_and_others_none():
    valid = validate_config(_config(), **ENV)
    assert valid.valid and [n.id for n in valid.notes] == OVERLAP_NOTES
    invalid = validate_config(_config(expert_model_parallel_size=1), **ENV)
    assert not invalid.valid and invalid.notes == []
    plain = validate_config({"model": _config()["model"]}, **ENV)  # overlap off: nothing of this applies
    assert plain.valid and plain.notes == []


def test_notes_follow_the_config():
    def text(result, note_id):
        return next(n.text for n in result.notes if n.id == note_id)

    counted = validate_config(_config() | {"train": {"global_batch_size": 64, "micro_batch_size": 1,
                                                     "data_parallel_size": 8}}, **ENV)
    assert "8 per data-parallel rank" in text(counted, "micro-batches")
    assert ">= 2 per data-parallel rank" in text(validate_config(_config(), **ENV), "micro-batches")
    tp = validate_config(_config(tensor_model_parallel_size=2, sequence_parallel=True), **ENV)
    assert "With TP or CP" in text(tp, "cuda-device-max-connections")
    assert "With TP or CP" not in text(validate_config(_config(), **ENV), "cuda-device-max-connections")
    released = validate_config(_config(ep_overlap_early_attn_memory_release=True), **ENV)
    assert "is on" in text(released, "memory-extra-micro-batch")
    wgrad = validate_config(_config() | {"comm_overlap": {"overlap_moe_expert_parallel_comm": True,
                                                          "delay_wgrad_compute": True}}, **ENV)
    assert text(wgrad, "delayed-wgrad-measured").startswith("Delayed wgrad is on")


def test_measured_figures_are_the_cards_evidence():
    metrics = " ".join(f"{m['magnitude']} {m['source']}" for m in CARD["expected_metric_change"])
    notes = {n.id: n for n in validate_config(_config(), **ENV).notes}
    for figure in ("+7.8%", "+3.7%"):
        assert figure in notes["cuda-device-max-connections"].text and figure in metrics
    for figure in ("31.31", "31.20", "4686", "4912", "4.8%"):
        assert figure in notes["delayed-wgrad-measured"].text and figure in metrics
    before, after = 31.31, 31.20  # +0.4%: the step-time gain of delayed wgrad on top of plain overlap
    assert f"+{(before / after - 1) * 100:.1f}%" in notes["delayed-wgrad-measured"].text


@pytest.mark.parametrize("version", releases.RELEASES)
def test_upstream_says_what_the_notes_say(version):
    if not releases.is_unpacked(version):
        pytest.skip(f"megatron-core {version} not unpacked (`make oracle-releases`)")
    core = releases.release_dir(version) / "megatron" / "core"
    # the option that frees attention activations early: the same field in every release
    assert re.search(r"^\s+ep_overlap_early_attn_memory_release: bool = False",
                     (core / "model_parallel_config.py").read_text(encoding="utf-8"), re.MULTILINE)
    # forward-only steps (eval) take the ordinary schedule, with and without pipelining
    schedules = (core / "pipeline_parallel" / "schedules.py").read_text(encoding="utf-8")
    assert schedules.count("overlap_moe_expert_parallel_comm and not forward_only") == 2
    # with VPP the overlap adds one warm-up micro-batch: the memory note's "one extra warm-up forward"
    assert "num_warmup_microbatches = num_warmup_microbatches + 1" in schedules


def test_every_generate_stage_carries_its_notes():
    result = generate_config(GenerateRequest(model="qwen3-30b-a3b", gpus=16, plan=True, gpu="H100"))
    for stage in result.stages:
        ids = [n.id for n in stage.next]
        assert ids == (["baseline-is-the-control"] if stage.stage == "baseline" else OVERLAP_NOTES), stage.stage
    overlap = next(s for s in result.stages if s.stage == "overlap")
    assert "64 per data-parallel rank" in next(n.text for n in overlap.next if n.id == "micro-batches")


def test_the_cli_prints_the_notes(capsys, tmp_path):
    assert main(["generate", "--model", "qwen3-30b-a3b", "--gpus", "16"]) == 0
    out = capsys.readouterr()
    assert "# next: Memory:" in out.err and "next:" not in out.out  # stdout stays the config alone
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(_config()))
    assert main(["validate", str(path), "--torch-version", "2.6.0", "--gpu", "H100"]) == 0
    assert "what matters next:" in capsys.readouterr().out
    assert main(["validate", str(path), "--torch-version", "2.6.0", "--format", "json"]) == 0
    assert [n["id"] for n in json.loads(capsys.readouterr().out)["notes"]] == OVERLAP_NOTES
