"""generate_config: the seed's configurations reproduced, the plan, every output format, CLI == API,
and requests that are refused or adjusted (the policy table of docs/generate.md)."""

import json
import os

import pytest
import yaml

from moe_overlap.cli import main
from moe_overlap.jsonout import lean_dump
from moe_overlap.paths import examples_dir
from moe_overlap.skill.config.model import effective_values, parse_config
from moe_overlap.skill.generate.api import generate_config, request_argv
from moe_overlap.skill.generate.model import GenerateRequest
from moe_overlap.skill.generate.render import FORMATS, render
from moe_overlap.skill.generate.resolve import STAGES, GenerateError
from moe_overlap.skill.models.layout import layout_stages
from moe_overlap.skill.models.shapes import MODELS
from moe_overlap.skill.rules.flex_backend import apply_flex_dispatcher_backend
from moe_overlap.verify.plan.config import VerifyConfig

ENV = {"torch_version": "2.6.0", "te_version": "2.7.0", "gpu": "H100"}

# The seed document's "Configuration Minimale Fonctionnelle", line for line, after creating cfg.comm_overlap:
# Megatron-Bridge recipes ship comm_overlap=None (megatron-bridge 0.6.2 training/config.py:1007), where setting
# a field would raise AttributeError.
SEED_MINIMAL = """\
from megatron.bridge.training.comm_overlap import CommOverlapConfig

if cfg.comm_overlap is None:  # Bridge recipes ship comm_overlap=None
    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)
cfg.comm_overlap.overlap_moe_expert_parallel_comm = True
cfg.comm_overlap.delay_wgrad_compute = False
cfg.model.expert_model_parallel_size = 4
cfg.model.num_moe_experts = 64
cfg.model.moe_token_dispatcher_type = "alltoall"
cfg.model.moe_shared_expert_overlap = False
cfg.model.bf16 = True
"""
# Every generated config carries the launcher's environment (Bridge's ConfigContainer.env_vars); in bridge-python
# it is set in the process too, before CUDA starts. Not part of the seed's example.
ENV_LINES = {"import os", 'os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "32"', 'cfg.env_vars["CUDA_DEVICE_MAX_CONNECTIONS"] = 32'}
# The seed's flex activation example (the lines it sets; EP and experts come from its alltoall example).
SEED_FLEX_LINES = [
    "from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend",
    "cfg.comm_overlap.overlap_moe_expert_parallel_comm = True",
    "cfg.comm_overlap.delay_wgrad_compute = True",
    "cfg.model.moe_shared_expert_overlap = False",
]


def _gen(**kw):
    return generate_config(GenerateRequest(**kw))


def _effective(config):
    values, _ = effective_values(parse_config(config))
    return values


def test_overlap_stage_reproduces_the_seed_minimal_config_key_for_key():
    result = _gen(ep=4, experts=64, dispatcher="alltoall", precision="bf16", stage="overlap", **ENV)
    assert result.ok
    stage = result.stages[0]
    minimal = yaml.safe_load((examples_dir() / "ep-overlap-minimal.yaml").read_text())
    config = dict(stage.config)
    assert config.pop("env_vars") == {"CUDA_DEVICE_MAX_CONNECTIONS": 32}
    assert config == minimal  # same keys, same values, nothing else
    lines = render(stage.config, "bridge-python").splitlines()
    assert ENV_LINES <= set(lines)
    assert "\n".join(line for line in lines if line not in ENV_LINES) + "\n" == SEED_MINIMAL
    assert stage.validation.valid and stage.validation.warnings == []


def test_overlap_wgrad_stage_is_the_seed_alltoall_activation_for_ep8():
    result = _gen(ep=8, experts=64, stage="overlap+wgrad", **ENV)
    seed = yaml.safe_load((examples_dir() / "ep-overlap-alltoall.yaml").read_text())
    config = result.stages[0].config
    # Every key the seed sets has the seed's value; the seed also pins fp16: false, which is Megatron's
    # default and is what the generated config means (effective values below are compared in full).
    assert set(config) == set(seed) | {"env_vars"}
    for section, values in seed.items():
        for key, value in values.items():
            if (section, key) == ("model", "fp16"):
                assert key not in config[section]
                continue
            assert config[section][key] == value, (section, key)
    assert _effective(config) == _effective(seed)
    assert result.stages[0].validation.warnings == ["wgrad-not-in-first-rollout"]


@pytest.mark.parametrize("backend", ["deepep", "hybridep"])
def test_flex_stage_is_the_seed_flex_activation_for_ep8(backend):
    result = _gen(ep=8, experts=64, stage="flex", flex_backend=backend, **ENV)
    assert result.ok and result.adjustments == []
    text = render(result.stages[0].config, "bridge-python")
    lines = text.splitlines()
    for line in SEED_FLEX_LINES + [f'apply_flex_dispatcher_backend(cfg.model, moe_flex_dispatcher_backend="{backend}")']:
        assert line in lines
    # the helper call replaces the dispatcher fields: setting the backend alone does nothing in Bridge
    assert "moe_token_dispatcher_type" not in text and "cfg.model.moe_flex_dispatcher_backend" not in text
    seed = yaml.safe_load((examples_dir() / "ep-overlap-alltoall.yaml").read_text())
    expected, _ = apply_flex_dispatcher_backend(seed, backend, "H100")
    assert _effective(result.stages[0].config) == _effective(expected)


def test_plan_has_every_stage_in_order_with_checks_and_commands():
    result = _gen(ep=8, experts=64, plan=True, **ENV)
    assert [s.stage for s in result.stages] == list(STAGES)
    for s in result.stages:
        names = [c.name for c in s.checks]
        assert names[:2] == ["validation", "no-hang"] and "throughput" in names
        assert ("loss-matches-baseline" in names) == (s.stage != "baseline")
        assert all(c.command for c in s.checks) and s.validation.valid
        assert f"--stage {s.stage} --to yaml" in s.checks[0].command
    overlap = [s.stage for s in result.stages if s.config["comm_overlap"]["overlap_moe_expert_parallel_comm"]]
    assert overlap == ["overlap", "overlap+wgrad", "flex"]
    assert result.stages[3].config["model"]["moe_token_dispatcher_type"] == "flex"


def test_moe_overlap_format_is_a_verify_config():
    for stage in STAGES:
        result = _gen(ep=4, experts=16, topk=4, stage=stage, to="moe-overlap", micro_batches=3, **ENV)
        cfg = VerifyConfig(**yaml.safe_load(result.stages[0].rendered))
        assert (cfg.expert_model_parallel_size, cfg.num_moe_experts, cfg.moe_router_topk) == (4, 16, 4)
        assert cfg.precision == "bf16" and cfg.micro_batches == 3
        assert cfg.overlap_moe_expert_parallel_comm == (stage != "baseline")
        assert cfg.delay_wgrad_compute == (stage in ("overlap+wgrad", "flex"))
        assert cfg.schedule == ("none" if stage == "baseline" else "1f1b")


@pytest.mark.parametrize("name", sorted(n for n, m in MODELS.items() if not m.layer_only))
def test_models_have_full_shapes_and_a_public_source(name):
    p = MODELS[name]
    assert p.source.startswith("https://huggingface.co/") and p.source.endswith("config.json")
    assert p.num_moe_experts > 1 and 1 <= p.moe_router_topk <= p.num_moe_experts
    result = _gen(model=name, gpus=16, **ENV)
    model = result.stages[0].config["model"]
    assert model["num_moe_experts"] == p.num_moe_experts and model["moe_ffn_hidden_size"] == p.moe_ffn_hidden_size
    assert model["ffn_hidden_size"] == p.ffn_hidden_size and model["num_layers"] == p.num_layers
    assert ("q_lora_rank" in model) if p.mla else (model["kv_channels"] == p.kv_channels)
    assert model["expert_model_parallel_size"] == {"qwen3-30b-a3b": 16, "deepseek-v3": 16, "mixtral-8x7b": 8,
                                                    "qwen3-235b-a22b": 16, "qwen3-next-80b-a3b": 16}[name]
    assert _gen(preset=name, gpus=16, **ENV) == result  # --preset stays an alias of --model


def test_unknown_layer_only_shape_is_refused_for_generate():
    with pytest.raises(GenerateError) as info:
        _gen(model="deepseek-v3-proxy", gpus=8)
    assert info.value.field == "model" and "deepseek-v3" in info.value.choices


# ---- CLI == API -------------------------------------------------------------------------------------------

def _cli(capsys, argv):
    code = main(["generate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("stage", ["overlap", "flex"])
def test_cli_output_equals_api_output(capsys, fmt, stage):
    req = GenerateRequest(ep=8, experts=64, topk=2, stage=stage, to=fmt, gpu="H100", micro_batches=4)
    api = generate_config(req)
    code, out, _ = _cli(capsys, [*request_argv(req), "--to", fmt])
    assert code == 0
    assert out == api.stages[0].rendered == render(api.stages[0].config, fmt, micro_batches=4)
    code, out, _ = _cli(capsys, [*request_argv(req), "--to", fmt, "--format", "json"])
    assert code == 0 and json.loads(out) == lean_dump(api)  # the shape generate_config returns over MCP


def test_cli_plan_json_equals_api(capsys):
    req = GenerateRequest(model="qwen3-30b-a3b", gpus=16, plan=True, to="megatron-args", **ENV)
    code, out, _ = _cli(capsys, [*request_argv(req), "--to", "megatron-args", "--format", "json"])
    assert code == 0 and json.loads(out) == lean_dump(generate_config(req))
    code, out, _ = _cli(capsys, [*request_argv(req), "--to", "megatron-args"])
    assert code == 0 and out.count("# ===== stage") == 4
    for s in generate_config(req).stages:
        assert s.rendered in out


# ---- refused / adjusted requests --------------------------------------------------------------------------

REFUSED = [
    (dict(ep=1, experts=64), "ep-size-gt-1", {"ep": 2}),
    (dict(ep=6, experts=64), "ep-divides-experts", {"ep": 4}),
    (dict(ep=8, experts=64, stage="flex", gpu="V100"), "flex-backend-gpu-support",
     {"stage": "overlap+wgrad"}),
    (dict(ep=8, experts=64, dispatcher="flex", gpu="T4"), "flex-backend-gpu-support", {"dispatcher": "alltoall"}),
    (dict(ep=4, experts=64, pp=4, num_layers=4), "pp-requires-vpp", {"pp": 2}),
    (dict(ep=4, experts=64, pp=2, vpp=5, num_layers=8), "pp-requires-vpp", {"vpp": 4}),
    (dict(ep=4, experts=64, recompute="full"), "no-full-recompute", {"recompute": "selective"}),
    (dict(ep=4, experts=64, torch_version="2.5.1"), "torch-min-2-6", {"torch_version": "2.6.0"}),
    (dict(ep=4, experts=1), "num-experts-gt-1", {"experts": 4}),
    (dict(model="deepseek-v3", gpus=256, pp=64), "pp-requires-vpp", {"pp": 16}),  # a PP that 256 GPUs allow
    (dict(ep=1, experts=1, plan=True), "num-experts-gt-1", {"experts": 2, "ep": 2}),
]


@pytest.mark.parametrize("kw,rule,nearest", REFUSED)
def test_unsatisfiable_requests_are_refused_with_rule_and_nearest_valid_request(capsys, kw, rule, nearest):
    req = GenerateRequest(**kw)
    result = generate_config(req)
    assert not result.ok and result.stages == []
    assert rule in result.refusal.rule_ids
    for key, value in nearest.items():
        assert result.refusal.nearest_request[key] == value
    fixed = generate_config(req.model_copy(update=result.refusal.nearest_request))
    assert fixed.ok and all(s.validation.valid for s in fixed.stages)
    code, out, err = _cli(capsys, request_argv(req))
    assert code == 2 and out == "" and rule in err and result.refusal.nearest_command in err


def test_fp32_is_adjusted_to_bf16_with_a_note(capsys):
    result = _gen(ep=4, experts=64, precision="fp32", plan=True, **ENV)
    assert result.ok and [a.field for a in result.adjustments] == ["precision"]
    assert result.adjustments[0].rule == "precision-bf16-or-fp16"
    assert all(s.config["model"]["bf16"] is True for s in result.stages)  # the baseline too: like for like
    code, _, err = _cli(capsys, ["--ep", "4", "--experts", "64", "--precision", "fp32"])
    assert code == 0 and "precision: fp32 -> bf16" in err


def test_tp_with_ep_turns_sequence_parallel_on():
    model = _gen(ep=4, experts=64, tp=2, **ENV).stages[0].config["model"]
    assert model["tensor_model_parallel_size"] == 2 and model["sequence_parallel"] is True
    assert "sequence_parallel" not in _gen(ep=4, experts=64, **ENV).stages[0].config["model"]


def test_vpp_without_pp_is_dropped_with_a_note():
    result = _gen(ep=4, experts=64, vpp=2, **ENV)
    assert result.ok and "virtual_pipeline_model_parallel_size" not in result.stages[0].config["model"]
    assert [(a.field, a.used) for a in result.adjustments] == [("vpp", None)]


def test_uneven_layers_get_a_pipeline_layout_not_a_refusal():
    result = _gen(model="deepseek-v3", gpus=64, pp=2, **ENV)
    model = result.stages[0].config["model"]
    assert result.ok and model["virtual_pipeline_model_parallel_size"] == 2
    stages = layout_stages(model["pipeline_model_parallel_layout"])
    assert len(stages) == 2 * 2 and sum(s.count("t") for s in stages) == 61 and stages[-1] == "mL"
    assert model["mtp_num_layers"] == 1  # the layout holds it: m in the last stage
    adjusted = _gen(ep=4, experts=64, pp=2, vpp=3, num_layers=8, **ENV)
    layout = adjusted.stages[0].config["model"]["pipeline_model_parallel_layout"]
    assert adjusted.ok and layout_stages(layout) == ["Et", "t", "tt", "tt", "tt", "L"]
    argv = render(adjusted.stages[0].config, "megatron-args")
    assert f"--pipeline-model-parallel-layout '{layout}'" in argv and "virtual" not in argv  # Megatron-LM: one of two


def test_pp_without_vpp_gets_the_smallest_even_vpp():
    result = _gen(ep=4, experts=64, pp=2, num_layers=12, **ENV)
    model = result.stages[0].config["model"]
    assert (model["pipeline_model_parallel_size"], model["virtual_pipeline_model_parallel_size"]) == (2, 2)
    assert result.adjustments[0].rule == "pp-requires-vpp"
    assert _gen(ep=4, experts=64, pp=3, num_layers=18, **ENV).stages[0].config["model"][
        "virtual_pipeline_model_parallel_size"] == 2
    assert _gen(ep=4, experts=64, pp=2, num_layers=6, **ENV).stages[0].config["model"][
        "virtual_pipeline_model_parallel_size"] == 3


def test_flex_backend_follows_the_gpu():
    gb200 = _gen(ep=8, experts=64, stage="flex", gpu="GB200", flex_backend="deepep")
    assert gb200.stages[0].config["model"]["moe_flex_dispatcher_backend"] == "hybridep"
    assert gb200.adjustments[0].field == "flex_backend"
    assert _gen(ep=8, experts=64, stage="flex", gpu="B200").stages[0].config["model"][
        "moe_flex_dispatcher_backend"] == "deepep"
    plan = _gen(ep=8, experts=64, plan=True, gpu="V100")
    assert plan.ok and [s.stage for s in plan.stages] == ["baseline", "overlap", "overlap+wgrad"]
    assert plan.adjustments[0].rule == "flex-backend-gpu-support"


@pytest.mark.parametrize("argv,field", [
    (["--experts", "64"], "ep"),
    (["--ep", "4"], "experts"),
    (["--ep", "4", "--experts", "8", "--topk", "9"], "topk"),
    (["--preset", "gpt-moe", "--gpus", "8"], "model"),
    (["--model", "gpt-moe", "--gpus", "8"], "model"),
    (["--ep", "4", "--experts", "64", "--gpu", "Voodoo5"], "gpu"),
    (["--ep", "4", "--experts", "64", "--pp", "2"], "num_layers"),
    (["--ep", "0", "--experts", "64"], "ep"),
    (["--preset", "mixtral-8x7b", "--gpus", "12", "--pp", "8"], "gpus"),
    (["--ep", "4", "--experts", "64", "--te-version", "2.x"], "te_version"),
])
def test_malformed_requests_exit_2_naming_the_field(capsys, argv, field):
    code, out, err = _cli(capsys, argv)
    assert code == 2 and out == "" and field.replace("_", "-").split("-")[0] in err.lower()
    code, out, _ = _cli(capsys, [*argv, "--format", "json"])
    assert code == 2 and "error" in json.loads(out)


def test_malformed_request_raises_generate_error_from_the_api():
    with pytest.raises(GenerateError) as info:
        _gen(ep=4, experts=8, topk=9)
    assert info.value.field == "topk" and info.value.fix


def test_verify_reads_the_moe_overlap_format_as_its_own():
    from moe_overlap.verify.plan.config import load_verify_config

    rendered = _gen(ep=2, experts=8, stage="overlap+wgrad", to="moe-overlap", micro_batches=4, **ENV).stages[0].rendered
    loaded = load_verify_config(yaml.safe_load(rendered))
    cfg = loaded.cfg
    assert loaded.kind == "moe-overlap" and loaded.notes == []
    assert cfg.delay_wgrad_compute and cfg.expert_model_parallel_size == 2


def test_every_request_field_is_described_for_mcp_clients():
    schema = GenerateRequest.model_json_schema()
    assert all(prop.get("description") for prop in schema["properties"].values())


def test_bridge_python_runs_on_a_recipe_whose_comm_overlap_is_none(monkeypatch):
    """Bridge recipes ship cfg.comm_overlap = None; the generated lines must create it, not raise AttributeError."""
    import sys
    import types
    from dataclasses import dataclass

    @dataclass
    class CommOverlapConfig:  # the one required field of Bridge's CommOverlapConfig (comm_overlap.py:384)
        tp_comm_overlap: bool
        overlap_moe_expert_parallel_comm: bool | None = None
        delay_wgrad_compute: bool | None = None

    module = types.ModuleType("megatron.bridge.training.comm_overlap")
    module.CommOverlapConfig = CommOverlapConfig
    monkeypatch.setitem(sys.modules, "megatron.bridge.training.comm_overlap", module)
    cfg = types.SimpleNamespace(comm_overlap=None, model=types.SimpleNamespace(), env_vars={})  # Bridge: {} default
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # the generated lines set it; restored afterwards
    stage = _gen(ep=4, experts=64, stage="overlap", **ENV).stages[0]
    exec(render(stage.config, "bridge-python"), {"cfg": cfg})  # noqa: S102 - our own generated code
    assert cfg.comm_overlap.overlap_moe_expert_parallel_comm is True and cfg.comm_overlap.tp_comm_overlap is False
    assert cfg.model.moe_shared_expert_overlap is False
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32" and cfg.env_vars == {"CUDA_DEVICE_MAX_CONNECTIONS": 32}
