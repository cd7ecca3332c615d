"""generate against upstream: Megatron-Bridge 0.6.2's recipes and converter (read from the unpacked wheel, never
imported: tests/oracle/bridge_recipes.py walks the recipe functions' syntax trees) and Megatron-Core 0.19.2's
TransformerConfig (built in a child process whose path starts with the unpacked release, tests/oracle/core_driver.py).

The two requests of issue 30: `generate --gpus 16 --model qwen3-30b-a3b` and `--model deepseek-v3 --gpus 256 --pp 8`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_overlap.skill.generate.api import generate_config
from moe_overlap.skill.generate.model import GenerateRequest
from moe_overlap.skill.models.recipes import RECIPES, Recipe
from tests.oracle import releases
from tests.oracle.bridge_recipes import read_recipe
from tests.oracle.fetch import bridge_dir

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
DRIVER = Path(__file__).resolve().parents[1] / "oracle" / "core_driver.py"
CORE = "0.19.2"
SHAPE_KEYS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
              "kv_channels", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "q_lora_rank",
              "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim", "mtp_num_layers",
              "moe_layer_freq", "moe_shared_expert_intermediate_size")
# (request, the Bridge recipe at this GPU count and PP, the recipe this model's VPP + layout at this PP come from)
CASES = [
    (dict(model="qwen3-30b-a3b", gpus=16),
     ("perf_recipes/qwen/h100/qwen3_moe.py", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config"), None),
    (dict(model="deepseek-v3", gpus=256, pp=8),
     ("recipes/deepseek/h100/deepseek_v3.py", "deepseek_v3_pretrain_256gpu_h100_bf16_32nodes_config"),
     ("perf_recipes/deepseek/h100/deepseek_v3.py", "deepseek_v3_pretrain_1024gpu_h100_bf16_config")),
]


def _need_bridge() -> None:
    if (bridge_dir() / "megatron" / "bridge" / "recipes").is_dir():
        return
    if os.environ.get(releases.REQUIRED_ENV):
        pytest.fail(f"megatron-bridge 0.6.2 is not unpacked in {bridge_dir()}: run `make oracle-releases`")
    pytest.skip(f"megatron-bridge 0.6.2 not unpacked in {bridge_dir()} (`make oracle-releases`)")


def _read(file: str, function: str) -> dict:
    _need_bridge()
    return read_recipe("megatron.bridge." + file[:-3].replace("/", "."), function)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: r.function)
def test_the_recipe_table_is_what_the_wheel_says(recipe: Recipe):
    got = _read(recipe.file, recipe.function)
    model = {k[len("model."):]: v for k, v in got.items() if k.startswith("model.")}
    assert (model["tensor_model_parallel_size"], model["pipeline_model_parallel_size"],
            model.get("virtual_pipeline_model_parallel_size"), model["expert_model_parallel_size"]) == (
        recipe.tp, recipe.pp, recipe.vpp, recipe.ep)
    assert model.get("expert_tensor_parallel_size") == recipe.etp
    assert (got["train.micro_batch_size"], got["train.global_batch_size"]) == (recipe.mbs, recipe.gbs)
    assert (model["moe_token_dispatcher_type"], model.get("moe_flex_dispatcher_backend")) == (
        recipe.dispatcher, recipe.backend if recipe.dispatcher == "flex" else model.get("moe_flex_dispatcher_backend"))
    assert model.get("pipeline_model_parallel_layout") == recipe.layout
    assert model.get("recompute_granularity") == recipe.recompute
    assert bool(got.get("comm_overlap.overlap_moe_expert_parallel_comm")) == recipe.overlap
    assert bool(got.get("comm_overlap.delay_wgrad_compute")) == recipe.wgrad
    assert (got.get("env_vars") or {}).get("CUDA_DEVICE_MAX_CONNECTIONS") == recipe.cuda_device_max_connections


def _bridge_shape(hf: dict) -> dict:
    """The Megatron shape Bridge 0.6.2 derives from an HF config: its CONFIG_MAPPING, plus the DeepSeek-V3 bridge's
    own lines for the dense layers and the shared expert (checked to be in the wheel as written here)."""
    _need_bridge()
    base = bridge_dir() / "megatron" / "bridge" / "models"
    tree = ast.parse((base / "conversion" / "model_bridge.py").read_text(encoding="utf-8"))
    mapping = next(ast.literal_eval(n.value) for n in ast.walk(tree) if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "CONFIG_MAPPING" for t in n.targets))
    out = {megatron: hf[name] for name, megatron in mapping if name in hf}
    if "first_k_dense_replace" in hf:
        text = (base / "deepseek" / "deepseek_v3_bridge.py").read_text(encoding="utf-8")
        assert "provider.moe_layer_freq = [0] * hf_config.first_k_dense_replace + [1] * (" in text
        assert ("provider.moe_shared_expert_intermediate_size = hf_config.moe_intermediate_size * "
                "hf_config.n_shared_experts") in text
        k = hf["first_k_dense_replace"]
        out["moe_layer_freq"] = [0] * k + [1] * (hf["num_hidden_layers"] - k)
        out["moe_shared_expert_intermediate_size"] = hf["moe_intermediate_size"] * hf["n_shared_experts"]
        out.pop("num_query_groups", None)  # MLA: the KV heads are the latent projection's, no GQA groups
    return out


def _generated(request: dict, **extra) -> list:
    result = generate_config(GenerateRequest(**request, torch_version="2.6.0", te_version="2.12.0", **extra))
    assert result.ok, result.refusal
    return result.stages


@pytest.mark.parametrize("request_, at_scale, with_vpp", CASES, ids=lambda c: c.get("model") if isinstance(c, dict)
                         else None)
def test_generated_config_matches_bridge_in_shape_and_parallel_layout(request_, at_scale, with_vpp):
    (stage,) = _generated(request_)
    model, train = stage.config["model"], stage.config["train"]
    hf = json.loads((HF / f"{request_['model']}.json").read_text(encoding="utf-8"))
    expected = _bridge_shape(hf)
    for key in SHAPE_KEYS:
        if key in expected:
            assert model.get(key) == expected[key], key
    recipe = _read(*at_scale)
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size"):
        assert model.get(key, 1) == recipe[f"model.{key}"], key
    if model.get("tensor_model_parallel_size", 1) > 1:
        assert model["expert_tensor_parallel_size"] == recipe["model.expert_tensor_parallel_size"]
        assert model["sequence_parallel"] is recipe["model.sequence_parallel"] is True
    assert (train["micro_batch_size"], train["global_batch_size"]) == (
        recipe["train.micro_batch_size"], recipe["train.global_batch_size"])
    vpp_recipe = recipe if with_vpp is None else _read(*with_vpp)
    assert model.get("virtual_pipeline_model_parallel_size") == vpp_recipe["model.virtual_pipeline_model_parallel_size"]
    assert model.get("pipeline_model_parallel_layout") == vpp_recipe["model.pipeline_model_parallel_layout"]
    assert stage.config["env_vars"]["CUDA_DEVICE_MAX_CONNECTIONS"] > 1


def test_dispatcher_follows_the_recipe_of_the_gpu():
    (h100,) = _generated(dict(model="qwen3-30b-a3b", gpus=16), gpu="H100")
    recipe = _read("perf_recipes/qwen/h100/qwen3_moe.py", "qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config")
    assert (h100.config["model"]["moe_token_dispatcher_type"], h100.config["model"]["moe_flex_dispatcher_backend"]) \
        == (recipe["model.moe_token_dispatcher_type"], recipe["model.moe_flex_dispatcher_backend"]) == ("flex",
                                                                                                        "hybridep")
    (plain,) = _generated(dict(model="qwen3-30b-a3b", gpus=16))  # no GPU given: correctness first, with a note
    assert plain.config["model"]["moe_token_dispatcher_type"] == "alltoall"


def _core_cases(stages) -> list[dict]:
    cases = []
    for stage in stages:
        model = dict(stage.config["model"])
        kwargs = {"moe_grouped_gemm": True, "attention_dropout": 0.0, "hidden_dropout": 0.0,
                  **stage.config["comm_overlap"], **model}
        if model.get("pipeline_model_parallel_size", 1) > 1:
            kwargs["pipeline_dtype"] = "bfloat16"  # Bridge's mixed-precision config sets it; the driver converts
        cls = "MLATransformerConfig" if model.get("multi_latent_attention") else "TransformerConfig"
        cases.append({"kwargs": kwargs, "torch": "2.6.0", "te": "2.12.0", "cls": cls})
    return cases


def test_core_0_19_2_accepts_every_stage_of_both_requests_and_the_other_models():
    if not releases.is_unpacked(CORE):
        if os.environ.get(releases.REQUIRED_ENV):
            pytest.fail(f"megatron-core {CORE} is not unpacked: run `make oracle-releases`")
        pytest.skip(f"megatron-core {CORE} not unpacked (`make oracle-releases`)")
    requests = [r for r, _, _ in CASES] + [dict(model="qwen3-235b-a22b", gpus=256, pp=8),  # 94 layers: a layout
                                           dict(model="qwen3-next-80b-a3b", gpus=128)]
    stages = [s for request_ in requests for gpu in (None, "H100")
              for s in _generated(request_, plan=True, gpu=gpu, megatron_core_version=CORE)]
    assert len(stages) == 4 * 2 * 4
    assert "pipeline_model_parallel_layout" in stages[-9].config["model"]  # the 235B plan's last stage
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": releases.python_path(CORE)}
    proc = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(_core_cases(stages)), capture_output=True,
                          text=True, env=env, timeout=600, cwd=str(DRIVER.parent))
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["file"].startswith(str(releases.release_dir(CORE)))
    rejected = [(s.stage, s.config["model"].get("num_layers"), r) for s, r in zip(stages, report["results"],
                                                                                  strict=True) if not r[0]]
    assert not rejected, rejected


def test_shapes_agree_with_what_the_recipes_set():
    """Where a recipe sets a shape field itself (MTP), it is the shape's."""
    from moe_overlap.skill.models.shapes import MODELS

    for recipe in RECIPES:
        got = _read(recipe.file, recipe.function)
        if "model.mtp_num_layers" in got:
            assert MODELS[recipe.model].mtp_num_layers == got["model.mtp_num_layers"], recipe.function
