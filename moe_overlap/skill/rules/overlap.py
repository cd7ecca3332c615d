"""Rules of EP communication overlap itself (`overlap_moe_expert_parallel_comm`): ANCHORS section 1, items 1-14,
the release-specific MTP rule, and the warnings a careful engineer adds."""

from __future__ import annotations

from moe_overlap.skill.rules.base import BRIDGE_SRC, CORE_SRC, Ctx, Rule, Unchecked, needs_version

ALL = ((0, 0), (99, 99))
OV = "overlap_moe_expert_parallel_comm"


def _ep(c: Ctx):
    return {} if c.overlap and c["expert_model_parallel_size"] <= 1 else None


def _experts(c: Ctx):
    n = c["num_moe_experts"]
    return {} if c.overlap and (n is None or n <= 1) else None


def _dispatcher(c: Ctx):
    return {} if c.overlap and c["moe_token_dispatcher_type"] not in ("alltoall", "flex") else None


def _precision(c: Ctx):
    return {} if c.overlap and not (c["bf16"] or c["fp16"]) else None


def _torch(c: Ctx):
    if not c.overlap:
        return None
    ok = needs_version("torch", c.env.torch_version, "2.6.0", "EP overlap hangs on older torch")
    return ok if isinstance(ok, Unchecked) else (None if ok else {"torch_version": c.env.torch_version})


def _vpp(c: Ctx):
    bad = c.overlap and c["pipeline_model_parallel_size"] > 1 and c["virtual_pipeline_model_parallel_size"] is None
    return {} if bad else None


def _full_recompute(c: Ctx):
    return {} if c.overlap and c["recompute_granularity"] == "full" else None


def _recompute_method(c: Ctx):
    return {} if c.overlap and c["recompute_method"] is not None else None


def _recompute_layers(c: Ctx):
    return {} if c.overlap and c["recompute_num_layers"] is not None else None


def _moe_recompute(c: Ctx):
    return {} if c.overlap and "moe" in (c["recompute_modules"] or []) else None


def _shared_overlap(c: Ctx):
    return {} if c.overlap and c["moe_shared_expert_overlap"] else None


def _mtp_limit(c: Ctx):
    allowed = (None, 0, 1) if c.core >= (0, 19) else (None, 1)
    if c.overlap and c["mtp_num_layers"] not in allowed:
        return {"allowed": " or ".join("unset" if a is None else str(a) for a in allowed)}
    return None


def _mtp_pp(c: Ctx):
    bad = c.overlap and c["mtp_num_layers"] == 1 and c["pipeline_model_parallel_size"] <= 1
    return {} if bad else None


def _cuda_graph(c: Ctx):
    impl, scope = c["cuda_graph_impl"], c["cuda_graph_scope"] or []
    if not c.overlap or impl == "none":
        return None
    if impl != "transformer_engine":
        return {"why": "only cuda_graph_impl=transformer_engine is supported with EP overlap"}
    bad = [s for s in scope if s in ("moe", "mlp")]
    return {"why": f"scope includes {', '.join(bad)}"} if bad else None


def _ncclep(c: Ctx):
    bad = (c.overlap and c["moe_token_dispatcher_type"] == "flex" and c["moe_flex_dispatcher_backend"] == "ncclep"
           and c["fine_grained_activation_offloading"] and "expert_fc1" in (c["offload_modules"] or []))
    return {} if bad else None


def _max_connections(c: Ctx):
    return {} if c.overlap and (c.env.cuda_device_max_connections or "").strip() == "1" else None


def _divides(c: Ctx):
    n, ep = c["num_moe_experts"], c["expert_model_parallel_size"]
    return {} if n and ep > 1 and n % ep else None


def _micro_batches(c: Ctx):
    gbs, mbs, dp = c["global_batch_size"], c["micro_batch_size"], c["data_parallel_size"]
    if not c.overlap or gbs is None or mbs is None:
        return None
    per_rank = gbs // (mbs * (dp or 1))
    # Without the DP size, gbs/mbs is an upper bound: only a bound of 1 proves a single micro-batch.
    return {"n": per_rank} if per_rank <= 1 else None


RULES: tuple[Rule, ...] = (
    Rule("ep-size-gt-1", "error", ("expert_model_parallel_size", OV), _ep,
         "EP overlap needs expert parallelism, but expert_model_parallel_size={expert_model_parallel_size}",
         "set model.expert_model_parallel_size > 1, or turn comm_overlap.overlap_moe_expert_parallel_comm off",
         CORE_SRC, core=ALL, bridge=True),
    Rule("num-experts-gt-1", "error", ("num_moe_experts", OV), _experts,
         "EP overlap needs an MoE model with more than one expert, but num_moe_experts={num_moe_experts}",
         "set model.num_moe_experts > 1 (a dense model has no expert all-to-all to overlap)",
         BRIDGE_SRC, bridge=True),
    Rule("dispatcher-alltoall-or-flex", "error", ("moe_token_dispatcher_type", OV), _dispatcher,
         "EP overlap needs the alltoall or flex token dispatcher, but moe_token_dispatcher_type="
         "{moe_token_dispatcher_type}", "set model.moe_token_dispatcher_type: alltoall (or flex with DeepEP/HybridEP)",
         CORE_SRC, core=ALL, bridge=True),
    Rule("precision-bf16-or-fp16", "error", ("bf16", "fp16", OV), _precision,
         "EP overlap needs a bf16 or fp16 model, but bf16={bf16} and fp16={fp16}",
         "set model.bf16: true (or mixed_precision: bf16_mixed)", CORE_SRC, core=ALL, bridge=True),
    Rule("torch-min-2-6", "error", ("environment.torch_version", OV), _torch,
         "EP overlap hangs with torch < 2.6.0, and torch is {torch_version}",
         "upgrade torch to >= 2.6.0", CORE_SRC, core=ALL, bridge=True),
    Rule("pp-requires-vpp", "error", ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size", OV),
         _vpp, "with pipeline_model_parallel_size={pipeline_model_parallel_size} > 1, EP overlap needs the "
         "interleaved schedule, but virtual_pipeline_model_parallel_size is not set",
         "set model.virtual_pipeline_model_parallel_size (>= 2 and dividing the layers per stage)",
         CORE_SRC, core=ALL, bridge=True),
    Rule("no-full-recompute", "error", ("recompute_granularity", OV), _full_recompute,
         "EP overlap cannot run with full recomputation (recompute_granularity=full)",
         "use recompute_granularity: selective with modules other than moe, or unset it",
         CORE_SRC, core=ALL, bridge=True),
    Rule("no-recompute-method", "error", ("recompute_method", OV), _recompute_method,
         "EP overlap needs recompute_method unset, got {recompute_method}", "remove model.recompute_method",
         CORE_SRC, core=ALL, bridge=True),
    Rule("no-recompute-num-layers", "error", ("recompute_num_layers", OV), _recompute_layers,
         "EP overlap needs recompute_num_layers unset, got {recompute_num_layers}",
         "remove model.recompute_num_layers", CORE_SRC, core=ALL, bridge=True),
    Rule("no-moe-recompute-module", "error", ("recompute_modules", OV), _moe_recompute,
         "EP overlap cannot recompute the MoE module, but recompute_modules={recompute_modules} includes moe",
         "drop moe from model.recompute_modules (moe_act or layernorm recompute are fine)",
         CORE_SRC + " (from 0.17); Megatron-Bridge EP-overlap skill", core=((0, 17), (99, 99)), bridge=True),
    Rule("no-shared-expert-overlap", "error", ("moe_shared_expert_overlap", OV), _shared_overlap,
         "EP overlap and moe_shared_expert_overlap exclude each other, and moe_shared_expert_overlap is true",
         "set model.moe_shared_expert_overlap: false (EP overlap already hides the shared expert)",
         CORE_SRC, core=ALL, bridge=True),
    Rule("mtp-layers-limit", "error", ("mtp_num_layers", OV), _mtp_limit,
         "EP overlap supports at most one MTP layer (mtp_num_layers {allowed}), got {mtp_num_layers}",
         "set model.mtp_num_layers: 1, or unset it", CORE_SRC, core=ALL, bridge=True),
    Rule("mtp-requires-pp", "error", ("pipeline_model_parallel_size", "mtp_num_layers", OV), _mtp_pp,
         "with an MTP layer, EP overlap needs pipeline_model_parallel_size > 1 (megatron-core <= 0.17), got "
         "{pipeline_model_parallel_size}", "use pipeline parallelism (with VPP), drop the MTP layer, or move "
         "to megatron-core >= 0.18", CORE_SRC, holds=((0, 16), (0, 17)), core=((0, 16), (0, 17))),
    Rule("cuda-graph-scope-excludes-moe", "error", ("cuda_graph_scope", "cuda_graph_impl", OV), _cuda_graph,
         "CUDA graphs with EP overlap: {why} (cuda_graph_impl={cuda_graph_impl}, scope={cuda_graph_scope})",
         "use cuda_graph_impl: transformer_engine with a scope of attn and/or moe_router only, or turn graphs off",
         CORE_SRC, core=ALL),
    Rule("ncclep-no-fc1-offload", "error", ("offload_modules", "moe_flex_dispatcher_backend", OV), _ncclep,
         "the ncclep flex backend cannot offload expert_fc1 activations under EP overlap",
         "remove expert_fc1 from model.offload_modules, or use deepep/hybridep",
         CORE_SRC, holds=((0, 19), (99, 99)), core=((0, 19), (99, 99))),
    Rule("cuda-device-max-connections", "warning", ("environment.cuda_device_max_connections", OV), _max_connections,
         "CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the compute and communication streams, so EP overlap gains "
         "little (one public run: +3.7% at 1 vs +7.8% at 32)",
         "unset CUDA_DEVICE_MAX_CONNECTIONS or set it > 1 (e.g. 32) unless TP/CP overlap needs 1",
         "Megatron-LM PR 6311; Megatron-Core MoE README"),
    Rule("ep-divides-experts", "warning", ("num_moe_experts", "expert_model_parallel_size"), _divides,
         "expert_model_parallel_size={expert_model_parallel_size} does not divide num_moe_experts="
         "{num_moe_experts}; every EP rank must hold the same number of experts",
         "pick an EP size that divides the expert count", "Megatron-Core moe/moe_layer.py (local experts)"),
    Rule("single-micro-batch", "warning", ("global_batch_size", "micro_batch_size", OV), _micro_batches,
         "only {n} micro-batch per data-parallel rank: EP overlap pairs the forward of one micro-batch with the "
         "backward of another, so there is nothing to overlap",
         "use at least 2 micro-batches (global_batch_size >= 2 x micro_batch_size x data-parallel size)",
         "Megatron-Core pipeline_parallel/combined_1f1b.py (1F1B A2A overlap schedule)"),
)
