"""Random EP-overlap configs for the oracle, over every overlap-related field a release has.

`generate` draws each field independently (many violations at once); `near_valid` repairs every aspect but one,
so each check is, many times, the only reason for a rejection. `core_kwargs` turns a config into the keyword
arguments of one release's TransformerConfig (field names and the small settings Core pairs with some values,
so that no check unrelated to EP overlap rejects a config).
"""

from __future__ import annotations

import random
from typing import Any

Line = tuple[int, int]
RECOMPUTE_KEYS = ("recompute_granularity", "recompute_method", "recompute_num_layers", "recompute_modules")


def _graphs(rng: random.Random, model: dict, line: Line) -> None:
    impls = ["local", "transformer_engine", "transformer_engine"] + (["full_iteration"] if line >= (0, 18) else [])
    impl = model["cuda_graph_impl"] = rng.choice(impls)
    if impl == "full_iteration":
        model["cuda_graph_scope"] = []
        return
    scopes = [["attn"], ["attn", "moe_router"], ["moe_router"], ["attn", "moe_router", "moe_preprocess"], ["full"],
              None]
    if "moe" in (model.get("recompute_modules") or []):  # Core: no moe recompute under moe_router graphs
        scopes = [["attn"], ["full"], None]
    elif impl == "transformer_engine":
        scopes += [["moe"], ["mlp"], ["attn", "moe"]]
    model["cuda_graph_scope"] = rng.choice(scopes)


def generate(rng: random.Random, line: Line) -> tuple[dict[str, Any], dict[str, str]]:
    """One config in our nested format, and the environment (versions, GPU) it is checked against."""
    pp = rng.choice([1, 1, 2])
    granularity = rng.choice([None, None, None, "selective", "selective", "full"])
    backends = ["deepep", "hybridep", "ncclep"]
    model: dict[str, Any] = {
        "expert_model_parallel_size": rng.choice([1, 2, 4, 8, 8]),
        "num_moe_experts": rng.choice([1, 2, 8, 16, 16]),
        "moe_token_dispatcher_type": rng.choice(["allgather", "alltoall", "alltoall", "alltoall", "flex", "flex"]),
        "bf16": (prec := rng.choice(["bf16", "bf16", "bf16", "fp16", "fp32"])) == "bf16",
        "fp16": prec == "fp16",
        "pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": rng.choice([None, 2, 2]) if pp > 1 else None,
        "recompute_granularity": granularity,
        "moe_shared_expert_overlap": False,
        "moe_shared_expert_intermediate_size": rng.choice([None, None, 16]),
        "mtp_num_layers": rng.choice([None, None, None, None, 0, 1, 2]),
        "gradient_accumulation_fusion": rng.choice([True, False]),
        "add_bias_linear": rng.choice([True, False]),
        "add_qkv_bias": rng.random() < 0.2,
        "ep_overlap_early_attn_memory_release": rng.random() < 0.15,
        "transformer_impl": rng.choice([None, None, None, "transformer_engine", "local"]),
    }
    if model["moe_token_dispatcher_type"] == "alltoall" and rng.random() < 0.15:
        model["moe_shared_expert_overlap"] = True  # Core allows it with alltoall only
    if rng.random() < 0.4:
        model["moe_flex_dispatcher_backend"] = rng.choice(backends)
    if rng.random() < 0.12:
        model["moe_enable_deepep"] = True
    if line == (0, 16):
        model["moe_use_legacy_grouped_gemm"] = rng.random() < 0.1
    if line >= (0, 18):
        model["overlap_dispatch_backward_with_experts_wgrad"] = rng.random() < 0.15
    if granularity == "full":  # Core pairs full recompute with a method and a layer count
        model["recompute_method"] = rng.choice(["uniform", "block"])
        model["recompute_num_layers"] = 1
    elif granularity == "selective":
        model["recompute_method"] = rng.choice([None, None, "uniform"])
        model["recompute_modules"] = rng.choice([["core_attn"], ["moe_act"], ["moe"], ["layernorm", "moe"]])
    else:
        model["recompute_method"] = rng.choice([None, None, None, "block"])
        model["recompute_num_layers"] = rng.choice([None, None, None, 1])
    if granularity != "full" and rng.random() < 0.35:  # graphs with full recompute need full-iteration graphs
        _graphs(rng, model, line)
    if rng.random() < 0.15:
        model["fine_grained_activation_offloading"] = True
        model["offload_modules"] = rng.choice([["expert_fc1"], ["core_attn"], ["moe_act", "expert_fc1"]])
    fsdp = rng.random() < 0.1
    config = {
        "model": model,
        "comm_overlap": {"overlap_moe_expert_parallel_comm": rng.random() < 0.8,
                         "delay_wgrad_compute": rng.random() < 0.4},
        "ddp": {"overlap_grad_reduce": rng.choice([True, False]), "use_megatron_fsdp": fsdp,
                "fsdp_double_buffer": fsdp and rng.random() < 0.5},
    }
    _pair(config)
    env = {"torch_version": rng.choice(["2.5.1", "2.6.0", "2.6.0", "2.13.0"]),
           "te_version": rng.choice(["2.2.0", "2.6.0", "2.9.0", "2.10.0", "2.12.0", "2.12.0"]),
           "gpu": rng.choice(["H100", "H100", "A100", "GB200", "V100"])}
    return config, env


def _pair(config: dict) -> dict:
    """Settings Core pairs with some values, set in the config itself so both verdicts see the same config."""
    model = config["model"]
    impl = model.get("cuda_graph_impl", "none")
    if model.get("recompute_granularity") == "full" and impl != "none":
        model.pop("cuda_graph_impl")  # Core: full recompute only with full-iteration graphs
        model.pop("cuda_graph_scope", None)
    if model.get("fine_grained_activation_offloading") and impl in ("local", "full_iteration"):
        model.pop("fine_grained_activation_offloading")  # Core: offloading with TE graphs (or none) only
        model.pop("offload_modules", None)
    offload = model.get("fine_grained_activation_offloading")
    if offload and ("moe" in (model.get("cuda_graph_scope") or []) or "moe" in (model.get("recompute_modules") or [])):
        model.pop("fine_grained_activation_offloading")  # Core: no offloading under token drop or moe recompute
        model.pop("offload_modules", None)
    scope = model.get("cuda_graph_scope") or []
    if model["num_moe_experts"] <= 1 and any(s.startswith("moe") for s in scope):
        scope = model["cuda_graph_scope"] = ["attn"]  # Core: MoE graph scopes need an MoE model
    if "mlp" in scope:  # Core's scope parser wants a dense layer before "mlp" graphs are legal
        model["moe_layer_freq"] = [0, 1, 1, 1]
    if "moe" in scope:  # "moe" graphs need drop-and-pad, which deepep does not do
        model.update(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
        if model["moe_token_dispatcher_type"] == "flex" or model.get("moe_enable_deepep"):
            if model.get("moe_flex_dispatcher_backend") in (None, "deepep"):
                model["moe_flex_dispatcher_backend"] = "hybridep"
            model.pop("moe_enable_deepep", None)
    return config


def _repairs(config: dict, env: dict, line: Line) -> list:
    """Edits that each make one aspect of a generated config valid (a unit keeps Core's pairings intact)."""
    model, comm = config["model"], config["comm_overlap"]

    def graph():
        if model.get("cuda_graph_impl") == "local" and line < (0, 18):
            model["cuda_graph_impl"] = "transformer_engine"
        if model.get("cuda_graph_scope") in (["moe"], ["mlp"], ["attn", "moe"]):
            model["cuda_graph_scope"] = ["attn"]

    def recompute():
        for key in RECOMPUTE_KEYS:
            model.pop(key, None)

    def flex():
        model.pop("moe_enable_deepep", None)
        if model.get("moe_flex_dispatcher_backend") == "ncclep":
            if line >= (0, 19):
                model["moe_token_dispatcher_type"] = "flex"
            else:
                model["moe_flex_dispatcher_backend"] = "hybridep"

    def offload():
        model.pop("fine_grained_activation_offloading", None)
        model.pop("offload_modules", None)

    return [
        lambda: model.update(expert_model_parallel_size=8), lambda: model.update(num_moe_experts=16),
        lambda: model.update(moe_token_dispatcher_type="alltoall" if model["moe_token_dispatcher_type"] == "allgather"
                             else model["moe_token_dispatcher_type"]),
        lambda: model.update(bf16=True, fp16=False),
        lambda: model.update(virtual_pipeline_model_parallel_size=2 if model["pipeline_model_parallel_size"] > 1
                             else None),
        recompute, lambda: model.update(moe_shared_expert_overlap=False), lambda: model.update(mtp_num_layers=None),
        lambda: model.update(moe_use_legacy_grouped_gemm=False) if line == (0, 16) else None, graph,
        lambda: comm.update(overlap_moe_expert_parallel_comm=True), lambda: env.update(torch_version="2.6.0"),
        lambda: env.update(te_version="2.12.0"), flex, offload,
        lambda: model.update(ep_overlap_early_attn_memory_release=False),
        lambda: model.update(overlap_dispatch_backward_with_experts_wgrad=False) if line >= (0, 18) else None,
    ]


def _breaks(config: dict, env: dict, line: Line) -> list:
    """For each repair unit, an edit that violates it again on purpose (same order as _repairs)."""
    model, comm = config["model"], config["comm_overlap"]
    pick = random.Random(repr(sorted(model.items(), key=str))).choice

    def recompute():
        for key in RECOMPUTE_KEYS:
            model.pop(key, None)
        model.update(pick([{"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
                           {"recompute_granularity": "selective", "recompute_method": "uniform"},
                           {"recompute_num_layers": 1},
                           {"recompute_granularity": "selective", "recompute_modules": ["moe"]}]))
        if "moe" in (model.get("recompute_modules") or []) and model.get("cuda_graph_scope"):
            model["cuda_graph_scope"] = ["attn"]

    def mtp():
        if line <= (0, 17) and pick([True, False]):
            model.update(mtp_num_layers=1, pipeline_model_parallel_size=1, virtual_pipeline_model_parallel_size=None)
        else:
            model["mtp_num_layers"] = pick([2, 0] if line < (0, 19) else [2])

    def graph():
        options = [("transformer_engine", ["attn", "moe"]), ("transformer_engine", ["mlp"]),
                   ("transformer_engine", None)]
        if line < (0, 18):
            options.append(("local", ["attn"]))
        impl, scope = pick(options)
        model.update(cuda_graph_impl=impl, cuda_graph_scope=scope)

    def te():
        comm["delay_wgrad_compute"] = True
        env["te_version"] = pick(["2.9.0", "2.2.0"])
        model.update(cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])

    def flex():
        options = [{"moe_enable_deepep": True, "moe_token_dispatcher_type": "alltoall"},
                   {"moe_enable_deepep": True, "moe_token_dispatcher_type": "flex",
                    "moe_flex_dispatcher_backend": "hybridep"},
                   {"moe_flex_dispatcher_backend": "ncclep",
                    "moe_token_dispatcher_type": "alltoall" if line >= (0, 19) else "flex"}]
        model.update(pick(options))

    def offload():
        model.update(fine_grained_activation_offloading=True, offload_modules=["expert_fc1"])
        if line >= (0, 19):
            model.update(moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="ncclep")

    def dispatch():
        if line >= (0, 18):
            model["overlap_dispatch_backward_with_experts_wgrad"] = True
            if pick([True, False]):
                comm.update(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)
                env["te_version"] = pick(["2.2.0", "2.12.0"])

    return [
        lambda: model.update(expert_model_parallel_size=1), lambda: model.update(num_moe_experts=1),
        lambda: model.update(moe_token_dispatcher_type="allgather"), lambda: model.update(bf16=False, fp16=False),
        lambda: model.update(pipeline_model_parallel_size=2, virtual_pipeline_model_parallel_size=None), recompute,
        lambda: model.update(moe_shared_expert_overlap=True, moe_token_dispatcher_type="alltoall"), mtp,
        lambda: (model.update(moe_use_legacy_grouped_gemm=True), comm.update(delay_wgrad_compute=True))
        if line == (0, 16) else None, graph,
        lambda: comm.update(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=pick([True, False])),
        lambda: env.update(torch_version="2.5.1"), te, flex, offload,
        lambda: (model.update(ep_overlap_early_attn_memory_release=True),
                 comm.update(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)), dispatch,
    ]


def near_valid(rng: random.Random, line: Line) -> tuple[dict[str, Any], dict[str, str]]:
    """A generated config with every aspect but one repaired, and that one mostly broken on purpose: each check
    gets many cases where it alone decides."""
    config, env = generate(rng, line)
    units = _repairs(config, env, line)
    keep = rng.randrange(len(units))
    for i, repair in enumerate(units):
        if i != keep:
            repair()
    if rng.random() < 0.7:
        _breaks(config, env, line)[keep]()
    model = config["model"]
    for key in ("moe_layer_freq", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity"):
        model.pop(key, None)  # paired again below for the scope as it is now
    _pair(config)
    return config, env


def core_kwargs(config: dict, line: Line) -> dict[str, Any]:
    """Our nested config -> one release's TransformerConfig keyword arguments (a tiny model; dropout off)."""
    model = dict(config["model"])
    kwargs: dict[str, Any] = {
        "num_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "ffn_hidden_size": 32, "moe_ffn_hidden_size": 16,
        "moe_grouped_gemm": True, "attention_dropout": 0.0, "hidden_dropout": 0.0, **config["comm_overlap"]}
    if model["pipeline_model_parallel_size"] > 1:
        kwargs["pipeline_dtype"] = "bfloat16"  # the driver turns it into torch.bfloat16
    scope = model.pop("cuda_graph_scope", None)
    name = "cuda_graph_modules" if line >= (0, 18) else "cuda_graph_scope"
    if scope is not None:
        kwargs[name] = "full" if scope == ["full"] else list(scope)
    if model.get("moe_shared_expert_intermediate_size") is None:
        model.pop("moe_shared_expert_intermediate_size", None)
    kwargs.update({k: v for k, v in model.items() if v is not None or k == "mtp_num_layers"})
    return kwargs
