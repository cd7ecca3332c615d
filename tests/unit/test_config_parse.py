"""Config parsing: every input form, Bridge precedence, notes, and one clear ConfigError per kind of bad input."""

from pathlib import Path

import pytest

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.config.model import effective_values, parse_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _notes(cfg):
    return {(n.kind, n.path): n.message for n in cfg.notes}


def test_nested_yaml_file():
    cfg = parse_config(EXAMPLES / "ep-overlap-alltoall.yaml")
    values, paths = effective_values(cfg)
    assert values["overlap_moe_expert_parallel_comm"] is True
    assert values["delay_wgrad_compute"] is True
    assert values["expert_model_parallel_size"] == 8
    assert paths["delay_wgrad_compute"] == "comm_overlap.delay_wgrad_compute"
    assert cfg.notes == []


def test_path_given_as_string_and_yaml_text():
    as_path = parse_config(str(EXAMPLES / "ep-overlap-minimal.yaml"))
    as_text = parse_config((EXAMPLES / "ep-overlap-minimal.yaml").read_text())
    assert as_path.model == as_text.model


def test_comm_overlap_overrides_model_as_bridge_does():
    cfg = parse_config({"model": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
                        "comm_overlap": {"delay_wgrad_compute": False}})
    values, paths = effective_values(cfg)
    # Bridge writes comm_overlap's values onto the model, False for one it leaves unset (megatron-bridge 0.6.2
    # comm_overlap.py:438-439, :559, :618), so the model's own flag is overwritten.
    assert values["overlap_moe_expert_parallel_comm"] is False
    assert paths["overlap_moe_expert_parallel_comm"] == "comm_overlap.overlap_moe_expert_parallel_comm"
    assert values["delay_wgrad_compute"] is False
    assert [n.path for n in cfg.notes if n.kind == "wrong-section"] == ["model.overlap_moe_expert_parallel_comm"]
    # Without a comm_overlap section the model's flags stay.
    values, paths = effective_values(parse_config({"model": {"overlap_moe_expert_parallel_comm": True}}))
    assert values["overlap_moe_expert_parallel_comm"] is True
    assert paths["overlap_moe_expert_parallel_comm"] == "model.overlap_moe_expert_parallel_comm"


def test_comm_overlap_overrides_ddp_grad_reduce():
    cfg = parse_config({"ddp": {"overlap_grad_reduce": False}, "comm_overlap": {"overlap_grad_reduce": True}})
    assert effective_values(cfg)[0]["overlap_grad_reduce"] is True
    cfg = parse_config({"ddp": {"overlap_grad_reduce": True}})
    assert effective_values(cfg)[0]["overlap_grad_reduce"] is True


def test_dotted_overrides_are_typed_and_win():
    cfg = parse_config(EXAMPLES / "ep-overlap-minimal.yaml",
                       ["comm_overlap.delay_wgrad_compute=true", "model.expert_model_parallel_size=16",
                        "model.recompute_modules=[moe_act, layernorm]", "num_moe_experts=128"])
    values, _ = effective_values(cfg)
    assert values["delay_wgrad_compute"] is True
    assert values["expert_model_parallel_size"] == 16
    assert values["recompute_modules"] == ["moe_act", "layernorm"]
    assert values["num_moe_experts"] == 128


def test_megatron_lm_argv():
    cfg = parse_config(argv="pretrain_gpt.py --overlap-moe-expert-parallel-comm --expert-model-parallel-size 8 "
                            "--num-experts 64 --moe-token-dispatcher-type alltoall --bf16 --recompute-modules "
                            "moe_act layernorm --no-gradient-accumulation-fusion --overlap-grad-reduce "
                            "--lr 1e-4 --moe-router-topk-scaling 2")
    values, _ = effective_values(cfg)
    assert values["overlap_moe_expert_parallel_comm"] is True
    assert values["expert_model_parallel_size"] == 8 and values["num_moe_experts"] == 64
    assert values["bf16"] is True and values["recompute_modules"] == ["moe_act", "layernorm"]
    assert values["gradient_accumulation_fusion"] is False and values["overlap_grad_reduce"] is True
    # Flags no rule reads: one summary line naming them, not one finding each.
    (summary,) = [n for n in cfg.notes if n.kind == "unknown-key"]
    assert summary.path == "argv" and "2 Megatron-LM flag(s)" in summary.message
    assert "--lr" in summary.message and "--moe-router-topk-scaling" in summary.message


@pytest.mark.parametrize("flag,near", [("--overlap-moe-expert-paralel-comm", "--overlap-moe-expert-parallel-comm"),
                                       ("--delay-wgrad-compte", "--delay-wgrad-compute"),
                                       ("--expert-model-parallel-szie", "--expert-model-parallel-size")])
def test_argv_flag_one_edit_from_a_known_one_is_an_error(flag, near):
    with pytest.raises(ConfigError) as err:
        parse_config(argv=f"pretrain_gpt.py {flag} --bf16")
    assert near in err.value.message and err.value.field == flag


def test_argv_bad_integer_names_the_flag():
    with pytest.raises(ConfigError, match="--expert-model-parallel-size expects an integer"):
        parse_config(argv=["--expert-model-parallel-size", "eight"])


@pytest.mark.parametrize("argv", ['--num-experts 8 --data-path "/a b', "--bf16 trailing\\"])
def test_argv_that_a_shell_cannot_split_is_a_config_error(argv, capsys):
    with pytest.raises(ConfigError, match="cannot split the flags") as err:
        parse_config(argv=argv)
    assert err.value.field == "argv"
    from moe_overlap.cli import main

    assert main(["validate", "--argv", argv]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_unknown_keys_kept_with_did_you_mean():
    cfg = parse_config({"model": {"expert_model_paralell_sizes": 8, "moe_router_topk": 8, "overlap_grad_reduce": True},
                        "optimizer": {"lr": 1e-4}, "modelss": {}})
    notes = _notes(cfg)
    assert "did you mean 'expert_model_parallel_size'" in notes[("unknown-key", "model.expert_model_paralell_sizes")]
    assert ("unknown-key", "model.moe_router_topk") in notes
    assert "belongs in comm_overlap" in notes[("wrong-section", "model.overlap_grad_reduce")]
    assert "did you mean 'model'" in notes[("unknown-key", "modelss")]
    assert ("unknown-key", "optimizer") not in notes  # a known Bridge section: kept quietly
    assert cfg.model.model_extra["moe_router_topk"] == 8  # kept


@pytest.mark.parametrize("data,field,near", [
    ({"modle": {"expert_model_parallel_size": 8}}, "modle", "model"),
    ({"comm_overlap": {"overlap_moe_expert_paralel_comm": True}}, "comm_overlap.overlap_moe_expert_paralel_comm",
     "overlap_moe_expert_parallel_comm"),
    ({"model": {"delay_wgrad_comptue": True}}, "model.delay_wgrad_comptue", "delay_wgrad_compute"),
    ({"overlap_moe_expert_parallel_com": True}, "overlap_moe_expert_parallel_com", "overlap_moe_expert_parallel_comm"),
    ({"Model": {}}, "Model", "model"),
    ({"model": {"overlap_grad_reduc": True}}, "model.overlap_grad_reduc", "overlap_grad_reduce"),
])
def test_a_key_one_edit_from_a_known_one_is_an_error_naming_it(data, field, near):
    with pytest.raises(ConfigError) as err:
        parse_config(data)
    assert err.value.field == field and repr(near) in err.value.message and near in err.value.fix


def test_a_misspelt_overlap_flag_never_validates_valid():
    from moe_overlap.skill.rules.validate import validate_config

    right = {"model": {"expert_model_parallel_size": 8, "num_moe_experts": 64}}
    for spelling in ("overlap_moe_expert_paralel_comm", "overlap_moe_expert_parallel_coom",
                     "overlap_moe_expret_parallel_comm", "ovrelap_moe_expert_parallel_comm"):
        with pytest.raises(ConfigError, match="one edit away"):
            validate_config({**right, "comm_overlap": {spelling: True}}, detect=False, env={})


def test_real_megatron_core_fields_are_never_taken_for_misspellings():
    import dataclasses
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc = pytest.importorskip("megatron.core.transformer.transformer_config")
        ddp = pytest.importorskip("megatron.core.distributed.distributed_data_parallel_config")
    model_fields = [f.name for f in dataclasses.fields(tc.TransformerConfig)]
    ddp_fields = [f.name for f in dataclasses.fields(ddp.DistributedDataParallelConfig)]
    from moe_overlap.skill.config.model import DdpSection, ModelSection

    cfg = parse_config({"model": {k: 1 for k in model_fields if k not in ModelSection.model_fields},
                        "ddp": {k: 1 for k in ddp_fields if k not in DdpSection.model_fields}})
    assert cfg.model.model_extra  # kept as unknown keys (notes), none refused as a misspelling


def test_renamed_cuda_graph_field_accepted_under_both_names():
    old = parse_config({"model": {"cuda_graph_scope": ["attn"]}})
    new = parse_config({"model": {"cuda_graph_modules": "attn,moe_router"}})
    assert old.model.cuda_graph_scope == ["attn"]
    assert new.model.cuda_graph_scope == ["attn", "moe_router"]
    assert ("renamed-field", "model.cuda_graph_modules") in _notes(new)
    with pytest.raises(ConfigError, match="same setting with different values"):
        parse_config({"model": {"cuda_graph_scope": ["attn"], "cuda_graph_modules": ["moe"]}})


def test_top_level_flat_keys_placed_in_their_section():
    cfg = parse_config({"expert_model_parallel_size": 4, "delay_wgrad_compute": False})
    assert cfg.model.expert_model_parallel_size == 4
    assert ("derived-value", "model.expert_model_parallel_size") in _notes(cfg)


def test_mixed_precision_recipe_sets_bf16():
    values, _ = effective_values(parse_config({"mixed_precision": "bf16_mixed"}))
    assert values["bf16"] is True and values["fp16"] is False


def test_vpp_derived_from_layers_per_stage():
    values, _ = effective_values(parse_config(argv="--num-layers-per-virtual-pipeline-stage 2"))
    assert values["virtual_pipeline_model_parallel_size"] is not None


BAD = [
    ("model:\n  bf16: [true\n", r"YAML syntax error at line \d+, column \d+"),
    ("model:\n  expert_model_parallel_size: eight\n", r"model\.expert_model_parallel_size: .*integer.*'eight'"),
    ("model:\n  moe_token_dispatcher_type: alltoal\n", r"model\.moe_token_dispatcher_type: 'alltoal' is not one of "
                                                     r".*did you mean 'alltoall'"),
    ("", "empty config"),
    ("# only a comment\n", "empty config"),
    ("model:\n  bf16: true\n  bf16: false\n", r"duplicate key 'bf16' at line 3"),
    ("- model\n- ddp\n", "top level must be a mapping"),
    ("42\n", "top level must be a mapping"),
    ("model: 3\n", "model: must be a mapping"),
    ("model:\n  recompute_modules: 7\n", r"model\.recompute_modules"),
    ("model:\n  ? [a, b]\n  : 1\n", "key"),
    ("model:\n  expert_model_parallel_size: 0\n", r"model\.expert_model_parallel_size: .*greater than or equal to 1"),
]


@pytest.mark.parametrize("text,pattern", BAD)
def test_bad_text_gives_one_config_error(text, pattern):
    with pytest.raises(ConfigError, match=pattern):
        parse_config(text)


def test_bad_files(tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text("model:\n" + "  # padding\n" * 120_000)
    with pytest.raises(ConfigError, match="over the 1 MB limit"):
        parse_config(big)
    binary = tmp_path / "garbage.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match="binary file"):
        parse_config(binary)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"model:\n  name: caf\xe9\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        parse_config(latin)
    with pytest.raises(ConfigError, match="no such config file"):
        parse_config(tmp_path / "missing.yaml")
    dup = tmp_path / "dup.json"
    dup.write_text('{"model": {"bf16": true, "bf16": false}}')
    with pytest.raises(ConfigError, match="duplicate key 'bf16'"):
        parse_config(dup)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"model": {"bf16": tru}}')
    with pytest.raises(ConfigError, match="JSON syntax error at line 1, column"):
        parse_config(bad_json)


def test_override_without_equals():
    with pytest.raises(ConfigError, match="not KEY=VALUE"):
        parse_config({}, ["model.bf16"])
