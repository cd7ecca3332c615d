"""Megatron-LM's reading of its flags (moe_overlap/skill/config/megatron_lm.py): the derivations one by one.
Each expected value is what that release's validate_args gives (tests/unit/test_oracle_megatron_lm.py compares
the two on 400 command lines per release)."""

from __future__ import annotations

import pytest

from moe_overlap.skill.config.argv import parse_argv
from moe_overlap.skill.config.megatron_lm import layout_stages
from moe_overlap.skill.rules.validate import validate_config


def _read(argv: str):
    sections, notes, _flags = parse_argv(argv)
    return sections["model"], notes


def _kinds(notes):
    return [kind for kind, _path, _msg in notes]


@pytest.mark.parametrize("layout,stages", [
    ("Ettt|(tt|)*29,m|L", 32),  # the example in Core's PipelineParallelLayerLayout.parse_str_to_list
    ("Etttt|(tttt|)*6ttttL", 8), ("E|t*4|t*4|L", 4), ("Et*8|t*8|t*8|t*8L", 4), ("EttttL", 1)])
def test_layout_stages_follow_cores_grammar(layout, stages):
    parts = layout_stages(layout)
    assert len(parts) == stages and parts[0].startswith("E") and parts[-1].endswith("L")


@pytest.mark.parametrize("layout", ["(t|)*9999999", "t*" + "9" * 40, "(" + "t" * 4000 + "|)*20", "E" * 5000])
def test_layout_too_large_to_unroll_is_refused_not_built(layout):
    assert layout_stages(layout) is None


@pytest.mark.parametrize("argv,vpp", [
    ("--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 8", None),  # VPP 1
    ("--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4", 2),
    ("--num-layers 30 --pipeline-model-parallel-size 4 --account-for-embedding-in-pipeline-split "
     "--account-for-loss-in-pipeline-split --num-layers-per-virtual-pipeline-stage 2", 4),
    ("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 3", 3),
    ("--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 1", None),
    ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Ett|tt|tt|ttL", 2),
    ("--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout Ett|tt|tt|ttL", None),
    ("--pipeline-model-parallel-size 4 --num-layers 32", None),
])
def test_vpp_as_megatron_lm_derives_it(argv, vpp):
    model, notes = _read(argv)
    assert model["virtual_pipeline_model_parallel_size"] == vpp and "layer-split" not in _kinds(notes)
    assert "num_layers_per_virtual_pipeline_stage" not in model  # stands for nothing once derived


@pytest.mark.parametrize("argv,words", [
    ("--num-layers 30 --pipeline-model-parallel-size 4", "not divisible by --pipeline-model-parallel-size 4"),
    ("--num-layers 32 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 3",
     "8 layers per pipeline rank"),
    ("--pipeline-model-parallel-size 4 --pipeline-model-parallel-layout Ett|tt|ttL", "3 stages"),
    ("--num-layers 8 --num-virtual-stages-per-pipeline-rank 2 --pipeline-model-parallel-layout Et|t|t|tL",
     "given together"),
    ("--num-virtual-stages-per-pipeline-rank 2", "needs --pipeline-model-parallel-size > 1"),
    ("--pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --no-overlap-p2p-communication",
     "> 2 with --no-overlap-p2p-communication"),
    ("--num-layers 32 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6 "
     "--num-layers-per-virtual-pipeline-stage 2", "uneven pipeline stages"),
])
def test_layer_splits_megatron_lm_refuses_are_errors(argv, words):
    result = validate_config(argv=argv + " --bf16", detect=False, env={}, megatron_core_version="0.19.2")
    hits = [f for f in result.findings if f.rule == "config:layer-split"]
    assert not result.valid and hits and hits[0].severity == "error" and words in hits[0].message, result.findings


def test_uneven_stages_skip_the_even_split_check():
    model, notes = _read("--num-layers 30 --pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 6")
    assert "layer-split" not in _kinds(notes)


def test_layers_per_stage_without_num_layers_is_said_and_taken_as_set():
    model, notes = _read("--pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 2")
    assert model["num_layers_per_virtual_pipeline_stage"] == 2 and "virtual_pipeline_model_parallel_size" not in model
    assert any("without --num-layers" in msg for _k, _p, msg in notes)


def test_megatron_lm_defaults_and_spellings():
    model, notes = _read("--recompute-activations --enable-cuda-graph")
    assert model["gradient_accumulation_fusion"] is True and model["transformer_impl"] == "transformer_engine"
    assert model["recompute_granularity"] == "selective" and model["cuda_graph_impl"] == "local"
    model, _ = _read("--no-gradient-accumulation-fusion --transformer-impl local --external-cuda-graph")
    assert model["gradient_accumulation_fusion"] is False and model["transformer_impl"] == "local"
    assert model["cuda_graph_impl"] == "transformer_engine"


def test_unread_flags_are_one_line():
    _model, notes = _read("--lr 1e-4 --data-path /a /b --seq-length 4096 " + " ".join(f"--x{i} 1" for i in range(20)))
    (summary,) = [n for n in notes if n[0] == "unknown-key"]
    assert "23 Megatron-LM flag(s)" in summary[2] and "and 11 more" in summary[2] and "--lr" in summary[2]


@pytest.mark.parametrize("argv", ["--pipeline-model-parallel-size 0 --pipeline-model-parallel-layout Et|tL",
                                  "--num-layers 0 --pipeline-model-parallel-size 2",
                                  "--num-layers 8 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 0"])
def test_out_of_range_numbers_are_a_config_error_naming_the_field(argv):
    from moe_overlap.skill.config.load import ConfigError

    with pytest.raises(ConfigError) as err:
        validate_config(argv=argv, detect=False, env={})
    assert err.value.field and err.value.field.startswith("model.")
