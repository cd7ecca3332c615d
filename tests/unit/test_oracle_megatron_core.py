"""megatron-core as an oracle: on generated configs, our verdict on the rules Megatron-Core checks equals
whether the installed megatron-core's ``TransformerConfig(...)`` accepts the config.

The torch / Transformer Engine versions are generated too: Core reads them through ``is_torch_min_version`` /
``is_te_min_version``, which are replaced (in transformer_config's namespace only) by the generated versions.
The generator keeps clear of Core checks unrelated to EP overlap (recompute argument pairing, CUDA-graph
scopes that need drop-and-pad, dropout under graphed recompute); a rejection with any other message fails
the test, so a generator bug cannot hide as agreement.
"""

from __future__ import annotations

import random
import warnings

import pytest

from moe_overlap.skill.rules.validate import validate_config
from moe_overlap.skill.rules.versions import at_least

tc = pytest.importorskip("megatron.core.transformer.transformer_config")
CORE_VERSION = pytest.importorskip("importlib.metadata").version("megatron-core")
N_CONFIGS = 600

# Rules of our 0.16 rule set that Megatron-Core does not check, and why we still report them.
BRIDGE_ONLY = {
    "num-experts-gt-1": "Bridge asserts num_moe_experts > 1; Core accepts one expert with EP overlap",
    "no-moe-recompute-module": "Core checks it from 0.17; Bridge's EP-overlap guidance rejects it for every release",
    "wgrad-overlap-grad-reduce-te-2-7": "a DDP setting: Core's TransformerConfig never sees overlap_grad_reduce",
    "wgrad-grad-accum-fusion-te-2-7": "Bridge's CommOverlapConfig check; Core 0.16 has no TE 2.7 check",
    "wgrad-cuda-graph-te-2-12": "Bridge's CommOverlapConfig check (TE 2.12, gradient fusion, no attention bias)",
    "flex-backend-needs-flex-dispatcher": "Bridge semantics: a backend without type flex is silently ignored",
    "flex-backend-gpu-support": "Bridge checks the GPU at start-up; Core's config does not look at the GPU",
}
# Substrings of Core's EP-overlap / delayed-wgrad messages in TransformerConfig.__post_init__ (0.16).
OVERLAP_MESSAGES = ("A2A Overlap", "virtual_pipeline_model_parallel_size must be specified",
                    "overlap_moe_expert_parallel_comm", "MTP layernum", "Pipeline model parallel size must be",
                    "CUDA graph scope on moe and mlp", "delay_wgrad_compute")


def _generate(rng: random.Random) -> tuple[dict, dict]:
    """One config in our nested format, and the environment (versions, GPU) it is checked against."""
    pp = rng.choice([1, 1, 2])
    granularity = rng.choice([None, None, None, "selective", "selective", "full"])
    model = {
        "expert_model_parallel_size": rng.choice([1, 2, 4, 8, 8]),
        "num_moe_experts": rng.choice([1, 2, 8, 16, 16]),
        "moe_token_dispatcher_type": rng.choice(["allgather", "alltoall", "alltoall", "alltoall", "flex"]),
        "bf16": (prec := rng.choice(["bf16", "bf16", "bf16", "fp16", "fp32"])) == "bf16",
        "fp16": prec == "fp16",
        "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": rng.choice([None, 2, 2]) if pp > 1 else None,
        "recompute_granularity": granularity,
        "moe_shared_expert_overlap": rng.random() < 0.1,
        "mtp_num_layers": rng.choice([None, None, None, None, 0, 1, 2]),
        "moe_use_legacy_grouped_gemm": rng.random() < 0.1,
        "gradient_accumulation_fusion": rng.choice([True, False]),
        "add_bias_linear": rng.choice([True, False]),
    }
    if rng.random() < 0.3:
        model["moe_flex_dispatcher_backend"] = rng.choice(["deepep", "hybridep"])
    if granularity == "full":  # Core pairs full recompute with a method and a layer count
        model["recompute_method"] = rng.choice(["uniform", "block"])
        model["recompute_num_layers"] = 1
    elif granularity == "selective":
        model["recompute_method"] = rng.choice([None, None, "uniform"])
        model["recompute_modules"] = rng.choice([["core_attn"], ["moe_act"], ["moe"], ["layernorm", "moe"]])
    else:
        model["recompute_method"] = rng.choice([None, None, None, "block"])
        model["recompute_num_layers"] = rng.choice([None, None, None, 1])
    if granularity != "full" and rng.random() < 0.3:  # graphs with full recompute need full_iteration scope
        model["cuda_graph_impl"] = rng.choice(["local", "transformer_engine", "transformer_engine"])
        scopes = [["attn"], ["attn", "moe_router"], ["moe_router"], ["full"]]
        if model["num_moe_experts"] <= 1:  # Core: moe / moe_router graphs need an MoE model
            scopes = [["attn"], ["full"]]
        if (model["cuda_graph_impl"] == "transformer_engine" and "moe" not in (model.get("recompute_modules") or [])
                and model["num_moe_experts"] > 1):
            scopes += [["moe"], ["mlp"]]
        model["cuda_graph_scope"] = rng.choice(scopes)
        if model["cuda_graph_impl"] == "transformer_engine" and "moe" in (model.get("recompute_modules") or []):
            model["cuda_graph_scope"] = rng.choice([["attn"], ["full"]])
    config = {
        "model": model,
        "comm_overlap": {"overlap_moe_expert_parallel_comm": rng.random() < 0.85,
                         "delay_wgrad_compute": rng.random() < 0.4},
        "ddp": {"overlap_grad_reduce": rng.choice([True, False])},
    }
    env = {"torch_version": rng.choice(["2.5.1", "2.6.0", "2.6.0", "2.13.0"]),
           "te_version": rng.choice(["2.6.0", "2.9.0", "2.10.0", "2.12.0"]),
           "gpu": rng.choice(["H100", "A100", "GB200", "V100"])}
    return config, env


def _repair_units(config: dict, env: dict) -> list:
    """Edits that each make one aspect of a generated config valid (a unit keeps Core's pairings intact)."""
    model, comm = config["model"], config["comm_overlap"]

    def graph():
        if model.get("cuda_graph_impl") == "local":
            model["cuda_graph_impl"] = "transformer_engine"
        if model.get("cuda_graph_scope") in (["moe"], ["mlp"]):
            model["cuda_graph_scope"] = ["attn"]

    def recompute():
        for key in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"):
            model.pop(key, None)

    return [
        lambda: model.update(expert_model_parallel_size=8), lambda: model.update(num_moe_experts=16),
        lambda: model.update(moe_token_dispatcher_type="alltoall"), lambda: model.update(bf16=True, fp16=False),
        lambda: model.update(virtual_pipeline_model_parallel_size=2 if model["pipeline_model_parallel_size"] > 1
                             else None),
        recompute, lambda: model.update(moe_shared_expert_overlap=False), lambda: model.update(mtp_num_layers=None),
        lambda: model.update(moe_use_legacy_grouped_gemm=False), graph,
        lambda: comm.update(overlap_moe_expert_parallel_comm=True), lambda: env.update(torch_version="2.6.0"),
        lambda: env.update(te_version="2.12.0"),
    ]


def _near_valid(rng: random.Random) -> tuple[dict, dict]:
    """A generated config with every aspect but one repaired: each rule gets cases where it alone decides."""
    config, env = _generate(rng)
    units = _repair_units(config, env)
    keep = rng.randrange(len(units))
    for i, repair in enumerate(units):
        if i != keep:
            repair()
    if keep == len(units) - 1 and rng.random() < 0.5:
        # The TE version only matters to Core 0.16 with delayed wgrad under TE CUDA graphs: make that case common.
        config["comm_overlap"]["delay_wgrad_compute"] = True
        config["model"].update(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])
        for key in ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules"):
            config["model"].pop(key, None)
    return config, env


def _core_kwargs(config: dict) -> dict:
    """Our nested config -> TransformerConfig keyword arguments (a tiny model; dropout off)."""
    model = dict(config["model"])
    kwargs = {"num_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32,
              "moe_ffn_hidden_size": 16, "moe_grouped_gemm": True, "attention_dropout": 0.0, "hidden_dropout": 0.0,
              **config["comm_overlap"]}
    if model["pipeline_model_parallel_size"] > 1:
        import torch  # megatron-core imports it anyway; needed only for the pipeline dtype

        kwargs["pipeline_dtype"] = torch.bfloat16
    scope = model.pop("cuda_graph_scope", None)
    if scope is not None:
        kwargs["cuda_graph_scope"] = "full" if scope == ["full"] else list(scope)
    # Core's scope parser wants a moe-layer frequency pattern with a dense layer before "mlp" is legal.
    if scope and "mlp" in scope:
        kwargs["moe_layer_freq"] = [0, 1, 1, 1]
    if scope and "moe" in scope:  # "moe" graphs need drop-and-pad, which deepep does not do
        kwargs.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
        if model["moe_token_dispatcher_type"] == "flex":
            model["moe_flex_dispatcher_backend"] = "hybridep"
    kwargs.update({k: v for k, v in model.items() if v is not None or k == "mtp_num_layers"})
    return kwargs


def _core_verdict(monkeypatch, config: dict, env: dict) -> tuple[bool, str]:
    monkeypatch.setattr(tc, "is_torch_min_version", lambda v, check_equality=True: at_least(env["torch_version"], v))
    monkeypatch.setattr(tc, "is_te_min_version", lambda v, check_equality=True: at_least(env["te_version"], v))
    monkeypatch.setattr(tc, "get_te_version", lambda: env["te_version"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tc.TransformerConfig(**_core_kwargs(config))
        except (AssertionError, ValueError) as exc:
            return False, str(exc)
    return True, ""


def _our_verdict(config: dict, env: dict) -> tuple[bool, set[str], set[str]]:
    result = validate_config(config, megatron_core_version=CORE_VERSION, detect=False, env={}, **env)
    core_rules = set(result.rule_set.core_rules)
    errors = {f.rule for f in result.findings if f.severity == "error"}
    assert not [f for f in result.findings if "could not be checked" in f.message and f.rule in core_rules]
    return not (errors & core_rules), errors & core_rules, errors - core_rules


def test_oracle_agrees_with_megatron_core_on_generated_configs(monkeypatch):
    assert CORE_VERSION.startswith("0.16."), "this oracle is written against megatron-core 0.16"
    rng = random.Random(20261129)
    disagreements, accepted, rejected, bridge_only_fired, sole_reason = [], 0, 0, set(), set()
    for i in range(N_CONFIGS):
        config, env = _generate(rng) if i % 2 else _near_valid(rng)
        core_ok, message = _core_verdict(monkeypatch, config, env)
        if not core_ok:
            assert any(m in message for m in OVERLAP_MESSAGES), f"config {i}: unrelated Core rejection: {message}"
        ours_ok, ours_core, ours_bridge = _our_verdict(config, env)
        if core_ok != ours_ok:
            disagreements.append((i, message, sorted(ours_core), config, env))
        accepted += core_ok
        rejected += not core_ok
        if core_ok:
            bridge_only_fired |= ours_bridge
        elif len(ours_core) == 1:
            sole_reason |= ours_core
    assert not disagreements, f"{len(disagreements)} disagreements, first: {disagreements[0]}"
    # Both verdicts occur often enough for agreement to mean something.
    assert accepted >= 60 and rejected >= 60, (accepted, rejected)
    # Every rule Core checks in this release was, at least once, the only reason for a rejection.
    core_rules = set(validate_config({}, megatron_core_version=CORE_VERSION, detect=False, env={}).rule_set.core_rules)
    # Core pairs full recompute with a recompute_method, so no-full-recompute never fires alone.
    assert sole_reason | {"no-full-recompute"} == core_rules, core_rules - sole_reason
    # The intentional differences do show up: configs Core accepts and a Bridge-only rule rejects.
    assert bridge_only_fired >= {"num-experts-gt-1", "no-moe-recompute-module", "flex-backend-gpu-support"}


def test_bridge_only_list_matches_the_rule_set():
    result = validate_config({}, megatron_core_version=CORE_VERSION, detect=False, env={})
    assert set(result.rule_set.bridge_rules) == set(BRIDGE_ONLY)
