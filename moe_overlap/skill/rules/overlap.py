"""Rules of EP communication overlap itself (`overlap_moe_expert_parallel_comm`): the TransformerConfig checks of
every known megatron-core release, Megatron-Bridge's CommOverlapConfig checks, the asserts Core raises later
(at model build or the first step) that a config check can catch, and the warnings a careful engineer adds.
Each rule's source names the upstream file and line per release (sources.py)."""

from __future__ import annotations

from moe_overlap.skill.rules import sources as src
from moe_overlap.skill.rules.base import ALL, Ctx, Rule, Unchecked, needs_version

OV = "overlap_moe_expert_parallel_comm"
FROM_17 = ((0, 17), (99, 99))
FROM_18 = ((0, 18), (99, 99))
FROM_19 = ((0, 19), (99, 99))


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
        # Up to 0.17 every graph implementation but TE's is refused; from 0.18 only TE graphs are checked.
        if c.core < (0, 18):
            return {"why": f"megatron-core {c.core[0]}.{c.core[1]} supports only cuda_graph_impl=transformer_engine "
                           "with EP overlap"}
        return None
    bad = [s for s in scope if s in ("moe", "mlp")]
    return {"why": f"scope includes {', '.join(bad)}"} if bad else None


def _whole_layer_graph(c: Ctx):
    scope = [s for s in (c["cuda_graph_scope"] or []) if s != "full"]
    # An unset or empty scope ("full") captures the whole layer, MoE included.
    return {} if c.overlap and c["cuda_graph_impl"] == "transformer_engine" and not scope else None


def _early_release(c: Ctx):
    return {} if c["ep_overlap_early_attn_memory_release"] and not c.overlap else None


def _fsdp_double_buffer(c: Ctx):
    return {} if c.overlap and c["use_megatron_fsdp"] and c["fsdp_double_buffer"] else None


def _fsdp_graphs(c: Ctx):
    bad = c.overlap and c["use_megatron_fsdp"] and c["cuda_graph_impl"] not in ("none", "full_iteration")
    return {} if bad else None


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
         src.both("ep", "ep"), core=ALL, bridge=True),
    Rule("num-experts-gt-1", "error", ("num_moe_experts", OV), _experts,
         "EP overlap needs an MoE model with more than one expert, but num_moe_experts={num_moe_experts}",
         "set model.num_moe_experts > 1 (a dense model has no expert all-to-all to overlap)",
         src.bridge("experts"), bridge=True),
    Rule("dispatcher-alltoall-or-flex", "error", ("moe_token_dispatcher_type", OV), _dispatcher,
         "EP overlap needs the alltoall or flex token dispatcher, but moe_token_dispatcher_type="
         "{moe_token_dispatcher_type}", "set model.moe_token_dispatcher_type: alltoall (or flex with DeepEP/HybridEP)",
         src.both("dispatcher", "dispatcher"), core=ALL, bridge=True),
    Rule("precision-bf16-or-fp16", "error", ("bf16", "fp16", OV), _precision,
         "EP overlap needs a bf16 or fp16 model, but bf16={bf16} and fp16={fp16}",
         "set model.bf16: true (or mixed_precision: bf16_mixed)", src.both("precision", "precision"),
         core=ALL, bridge=True),
    Rule("torch-min-2-6", "error", ("environment.torch_version", OV), _torch,
         "EP overlap hangs with torch < 2.6.0, and torch is {torch_version}",
         "upgrade torch to >= 2.6.0", src.both("torch", "torch"), core=ALL, bridge=True),
    Rule("pp-requires-vpp", "error", ("virtual_pipeline_model_parallel_size", "pipeline_model_parallel_size", OV),
         _vpp, "with pipeline_model_parallel_size={pipeline_model_parallel_size} > 1, EP overlap needs the "
         "interleaved schedule, but virtual_pipeline_model_parallel_size is not set",
         "set model.virtual_pipeline_model_parallel_size (>= 2 and dividing the layers per stage); in Megatron-LM "
         "flags a VPP of 1 is none: --num-virtual-stages-per-pipeline-rank >= 2, "
         "--num-layers-per-virtual-pipeline-stage at most half the layers per rank, or a "
         "--pipeline-model-parallel-layout of >= 2 x PP stages",
         src.both("vpp", "vpp"), core=ALL, bridge=True),
    Rule("no-full-recompute", "error", ("recompute_granularity", OV), _full_recompute,
         "EP overlap cannot run with full recomputation (recompute_granularity=full) in any megatron-core "
         "release up to 0.19.2", "use recompute_granularity: selective with modules other than moe, or unset it "
         "(Megatron-LM's dev branch, PR 6311, adds per-layer full recompute under the overlap; no release has it)",
         src.both("full-recompute", "full-recompute"), core=ALL, bridge=True),
    Rule("no-recompute-method", "error", ("recompute_method", OV), _recompute_method,
         "EP overlap needs recompute_method unset, got {recompute_method}", "remove model.recompute_method",
         src.both("recompute-method", "recompute-method"), core=ALL, bridge=True),
    Rule("no-recompute-num-layers", "error", ("recompute_num_layers", OV), _recompute_layers,
         "EP overlap needs recompute_num_layers unset, got {recompute_num_layers}",
         "remove model.recompute_num_layers", src.both("recompute-layers", "recompute-layers"), core=ALL, bridge=True),
    Rule("no-moe-recompute-module", "error", ("recompute_modules", OV), _moe_recompute,
         "EP overlap cannot recompute the MoE module, but recompute_modules={recompute_modules} includes moe",
         "drop moe from model.recompute_modules (moe_act or layernorm recompute are fine)",
         src.both("moe-recompute", "moe-recompute"), core=FROM_17, bridge=True),
    Rule("no-shared-expert-overlap", "error", ("moe_shared_expert_overlap", OV), _shared_overlap,
         "EP overlap and moe_shared_expert_overlap exclude each other, and moe_shared_expert_overlap is true",
         "set model.moe_shared_expert_overlap: false (EP overlap already hides the shared expert)",
         src.both("shared-overlap", "shared-overlap"), core=ALL, bridge=True),
    Rule("mtp-layers-limit", "error", ("mtp_num_layers", OV), _mtp_limit,
         "EP overlap supports at most one MTP layer (mtp_num_layers {allowed}), got {mtp_num_layers}",
         "set model.mtp_num_layers: 1, or unset it",
         f"{src.core('mtp-1')}; {src.core('mtp-0-1')}; {src.bridge('mtp')}", core=ALL, bridge=True),
    Rule("mtp-requires-pp", "error", ("pipeline_model_parallel_size", "mtp_num_layers", OV), _mtp_pp,
         "with an MTP layer, EP overlap needs pipeline_model_parallel_size > 1 (megatron-core <= 0.17), got "
         "{pipeline_model_parallel_size}", "use pipeline parallelism (with VPP), drop the MTP layer, or move "
         "to megatron-core >= 0.18", src.core("mtp-pp"), holds=((0, 16), (0, 17)), core=((0, 16), (0, 17))),
    Rule("cuda-graph-scope-excludes-moe", "error", ("cuda_graph_scope", "cuda_graph_impl", OV), _cuda_graph,
         "CUDA graphs with EP overlap: {why} (cuda_graph_impl={cuda_graph_impl}, scope={cuda_graph_scope})",
         "with cuda_graph_impl: transformer_engine keep moe and mlp out of the scope (attn, moe_router, "
         "moe_preprocess); on megatron-core <= 0.17 use transformer_engine graphs or none",
         src.core("graph-scope"), core=ALL),
    Rule("cuda-graph-whole-layer", "error", ("cuda_graph_scope", "cuda_graph_impl", OV), _whole_layer_graph,
         "a Transformer Engine CUDA graph over the whole layer (cuda_graph_scope {cuda_graph_scope}) captures the "
         "MoE part, which EP overlap must run outside the graph: TransformerConfig accepts it, the first step "
         "asserts 'EP overlap must be disabled when CUDA graph captures the whole MLP/MoE part'",
         "name the graphed parts: cuda_graph_scope: [attn, moe_router, moe_preprocess] (cuda_graph_modules from "
         "megatron-core 0.18), or turn CUDA graphs off", src.core("graph-whole-layer"), runtime=ALL),
    Rule("ncclep-no-fc1-offload", "error", ("offload_modules", "moe_flex_dispatcher_backend", OV), _ncclep,
         "the ncclep flex backend cannot offload expert_fc1 activations under EP overlap",
         "remove expert_fc1 from model.offload_modules, or use deepep/hybridep",
         src.core("ncclep-offload"), holds=FROM_19, core=FROM_19),
    Rule("early-attn-release-needs-overlap", "error", ("ep_overlap_early_attn_memory_release", OV), _early_release,
         "ep_overlap_early_attn_memory_release only works with overlap_moe_expert_parallel_comm, which is off",
         "turn comm_overlap.overlap_moe_expert_parallel_comm on, or ep_overlap_early_attn_memory_release off",
         src.core("early-release"), core=ALL),
    Rule("fsdp-no-double-buffer", "error", ("fsdp_double_buffer", "use_megatron_fsdp", OV), _fsdp_double_buffer,
         "EP overlap with Megatron-FSDP does not support the FSDP double buffer (fsdp_double_buffer=true): "
         "asserted when the model is wrapped", "set ddp.fsdp_double_buffer: false (Megatron-LM turns it on by itself with "
         "--nccl-ub or --megatron-fsdp-max-pool-double-buffer)",
         src.core("fsdp-double-buffer"), holds=FROM_18, runtime=FROM_18),
    Rule("fsdp-no-per-layer-cuda-graphs", "error", ("cuda_graph_impl", "use_megatron_fsdp", OV), _fsdp_graphs,
         "EP overlap with Megatron-FSDP does not support per-layer CUDA graphs (cuda_graph_impl="
         "{cuda_graph_impl}): asserted when the model is wrapped",
         "use cuda_graph_impl: full_iteration or none with Megatron-FSDP",
         src.core("fsdp-graphs"), holds=FROM_18, runtime=FROM_18),
    Rule("cuda-device-max-connections", "warning", ("environment.cuda_device_max_connections", OV), _max_connections,
         "CUDA_DEVICE_MAX_CONNECTIONS=1 serialises the compute and communication streams, so EP overlap gains "
         "little (one public run: +3.7% at 1 vs +7.8% at 32)",
         "set CUDA_DEVICE_MAX_CONNECTIONS > 1 in the launcher's environment (Megatron-Bridge's DeepEP/HybridEP "
         "recipes use 32); it only counts when set before CUDA initialises, not from inside the training script. "
         "TP/CP comm overlap before Blackwell wants 1: measure both",
         "Megatron-LM PR 6311; megatron-core 0.19.2 megatron/training/arguments.py:1426-1435; megatron-bridge 0.6.2 "
         "src/megatron/bridge/perf_recipes/qwen/h100/qwen3_moe.py:88-99"),
    Rule("ep-divides-experts", "warning", ("num_moe_experts", "expert_model_parallel_size"), _divides,
         "expert_model_parallel_size={expert_model_parallel_size} does not divide num_moe_experts="
         "{num_moe_experts}; every EP rank must hold the same number of experts",
         "pick an EP size that divides the expert count", src.core("experts-divisible")),
    Rule("single-micro-batch", "warning", ("global_batch_size", "micro_batch_size", OV), _micro_batches,
         "only {n} micro-batch per data-parallel rank: EP overlap pairs the forward of one micro-batch with the "
         "backward of another, so there is nothing to overlap",
         "use at least 2 micro-batches (global_batch_size >= 2 x micro_batch_size x data-parallel size)",
         src.core("schedule-plan")),
)
