"""Rules of delayed weight-gradient computation (`delay_wgrad_compute`) and of its 0.18+ alternative,
`overlap_dispatch_backward_with_experts_wgrad`: Core's TransformerConfig checks per release, Megatron-Bridge's
CommOverlapConfig checks, Megatron-LM's argument checks (megatron/training/arguments.py) and the Transformer
Engine layer's own version check. Sources per release in sources.py."""

from __future__ import annotations

from moe_overlap.skill.rules import sources as src
from moe_overlap.skill.rules.base import ALL, Ctx, Rule, Unchecked, needs_version

DW = "delay_wgrad_compute"
DISPATCH = "overlap_dispatch_backward_with_experts_wgrad"
FROM_18 = ((0, 18), (99, 99))
MLM = ("Megatron-LM megatron/training/arguments.py (core_v0.16.1 tag: line {l16}; in the megatron-core wheel from "
       "0.17.1): ")


def _te(c: Ctx, minimum: str, why: str):
    ok = needs_version("te", c.env.te_version, minimum, why)
    return ok if isinstance(ok, Unchecked) else (None if ok else {"te_version": c.env.te_version})


def _requires_overlap(c: Ctx):
    return {} if c.wgrad and not c.overlap else None


def _grad_reduce_te(minimum: str):
    def check(c: Ctx):
        if not (c.wgrad and c["overlap_grad_reduce"]):
            return None
        return _te(c, minimum, "delayed wgrad with overlap_grad_reduce")
    return check


def _accum_fusion_te(c: Ctx):
    # Bridge checks `gradient_accumulation_fusion is True`: an unset value is not checked there either.
    if not (c.wgrad and c["gradient_accumulation_fusion"] is True):
        return None
    return _te(c, "2.7.0", "delayed wgrad with gradient_accumulation_fusion")


def _no_accum_fusion_te(c: Ctx):
    # Megatron-LM checks the opposite case: fusion turned off (its default is on).
    if not (c.wgrad and c["gradient_accumulation_fusion"] is False):
        return None
    return _te(c, "2.7.0", "delayed wgrad with gradient_accumulation_fusion off")


def _scope_flags(c: Ctx) -> tuple[bool, bool]:
    scope = c["cuda_graph_scope"] or []
    attn = "attn" in scope
    router = ("moe_router" in scope and c["moe_shared_expert_intermediate_size"] is not None
              and not c["moe_shared_expert_overlap"])
    return attn, router


def _graph_te_2_12(c: Ctx):
    # Bridge looks at the graph modules whatever cuda_graph_impl says, so a leftover scope counts too; Megatron-LM
    # (from 0.17) does the same, but only with overlap_grad_reduce.
    if not c.wgrad or (c.flavour == "megatron-lm" and not c["overlap_grad_reduce"]):
        return None
    attn, router = _scope_flags(c)
    if not (attn or router):
        return None
    problems = []
    te = _te(c, "2.12.0", "delayed wgrad inside a CUDA graph")
    if isinstance(te, Unchecked):
        return te
    if te is not None:
        problems.append(f"Transformer Engine {c.env.te_version} < 2.12.0")
    if c["gradient_accumulation_fusion"] is not True:
        problems.append("gradient_accumulation_fusion is not true (set it true)")
    if attn and (c["add_bias_linear"] or c["add_qkv_bias"]):
        problems.append("attention has a bias (set add_bias_linear and add_qkv_bias false)")
    return {"problems": "; ".join(problems)} if problems else None


def _graph_te_2_10(c: Ctx):
    if not (c.wgrad and c["cuda_graph_impl"] == "transformer_engine"):
        return None
    return _te(c, "2.10.0", "delayed wgrad with transformer_engine CUDA graphs")


def _legacy_gemm(c: Ctx):
    return {} if c.wgrad and c["moe_use_legacy_grouped_gemm"] else None


def _te_layers(c: Ctx):
    impl = c["transformer_impl"]
    return {} if c.wgrad and impl is not None and impl != "transformer_engine" else None


def _te_2_3(c: Ctx):
    if not c.wgrad or c["transformer_impl"] not in (None, "transformer_engine"):
        return None
    return _te(c, "2.3.0", "delayed wgrad in Transformer Engine layers")


def _dispatch_with_overlap(c: Ctx):
    return {} if c[DISPATCH] and c.overlap else None


def _dispatch_te(c: Ctx):
    return _te(c, "2.3.0", DISPATCH) if c[DISPATCH] else None


def _dispatch_with_wgrad(c: Ctx):
    return {} if c[DISPATCH] and c.wgrad else None


def _first_rollout(c: Ctx):
    return {} if c.wgrad and c.overlap else None


RULES: tuple[Rule, ...] = (
    Rule("wgrad-requires-overlap", "error", (DW, "overlap_moe_expert_parallel_comm"), _requires_overlap,
         "delay_wgrad_compute only works together with overlap_moe_expert_parallel_comm, which is off",
         "set comm_overlap.overlap_moe_expert_parallel_comm: true, or delay_wgrad_compute: false",
         src.both("wgrad-overlap", "wgrad-overlap"), core=ALL, bridge=True),
    Rule("wgrad-overlap-grad-reduce-te-2-7", "error", ("overlap_grad_reduce", DW), _grad_reduce_te("2.7.0"),
         "delayed wgrad with overlap_grad_reduce needs Transformer Engine >= 2.7.0 (Megatron-Bridge), found "
         "{te_version}", "upgrade Transformer Engine to >= 2.7.0 (2.8.0 under Megatron-LM), or set "
         "ddp.overlap_grad_reduce: false", src.bridge("wgrad-grad-reduce-te"), bridge=True),
    Rule("wgrad-overlap-grad-reduce-te-2-8", "error", ("overlap_grad_reduce", DW), _grad_reduce_te("2.8.0"),
         "delayed wgrad with overlap_grad_reduce needs Transformer Engine >= 2.8.0 when training with "
         "Megatron-LM (pretrain_gpt.py's argument checks; Megatron-Bridge asks 2.7.0), found {te_version}",
         "upgrade Transformer Engine to >= 2.8.0, or set ddp.overlap_grad_reduce: false",
         MLM.format(l16=1214) + src.core("mlm-grad-reduce-te"), runtime=ALL, mlm=True),
    Rule("wgrad-grad-accum-fusion-te-2-7", "error", ("gradient_accumulation_fusion", DW), _accum_fusion_te,
         "delayed wgrad with gradient_accumulation_fusion needs Transformer Engine >= 2.7.0 (Megatron-Bridge), "
         "found {te_version}", "upgrade Transformer Engine to >= 2.7.0",
         src.bridge("wgrad-fusion-te"), bridge=True),
    Rule("wgrad-no-grad-accum-fusion-te-2-7", "error", ("gradient_accumulation_fusion", DW), _no_accum_fusion_te,
         "delayed wgrad with gradient_accumulation_fusion turned off needs Transformer Engine >= 2.7.0 "
         "(Megatron-LM's argument checks), found {te_version}",
         "upgrade Transformer Engine to >= 2.7.0, or turn model.gradient_accumulation_fusion back on",
         MLM.format(l16=1218) + src.core("mlm-no-fusion-te"), runtime=ALL, mlm=True),
    Rule("wgrad-cuda-graph-te-2-12", "error", ("cuda_graph_scope", DW, "cuda_graph_impl"), _graph_te_2_12,
         "the delayed wgrad falls inside a CUDA graph (scope {cuda_graph_scope}): {problems}",
         "use Transformer Engine >= 2.12.0 with gradient_accumulation_fusion: true and no attention bias "
         "(add_bias_linear, add_qkv_bias false), or drop attn / moe_router from the CUDA graph scope",
         f"{src.bridge('wgrad-graph')}; with overlap_grad_reduce also Megatron-LM's {src.core('mlm-graph-te')}",
         bridge=True, runtime=((0, 17), (99, 99))),
    Rule("wgrad-cuda-graph-te-2-10", "error", ("cuda_graph_impl", DW), _graph_te_2_10,
         "delayed wgrad with cuda_graph_impl=transformer_engine needs Transformer Engine >= 2.10.0, found "
         "{te_version}", "upgrade Transformer Engine to >= 2.10.0, or turn CUDA graphs off",
         src.core("wgrad-graph-te"), core=ALL),
    Rule("wgrad-no-legacy-grouped-gemm", "error", ("moe_use_legacy_grouped_gemm", DW), _legacy_gemm,
         "delay_wgrad_compute does not work with the legacy grouped GEMM (moe_use_legacy_grouped_gemm=true) "
         "in megatron-core 0.16 (the field is gone from 0.17)", "set model.moe_use_legacy_grouped_gemm: false",
         src.core("wgrad-legacy-gemm"), holds=((0, 16), (0, 16)), core=((0, 16), (0, 16))),
    Rule("wgrad-needs-te-layers", "error", ("transformer_impl", DW), _te_layers,
         "delay_wgrad_compute needs the Transformer Engine layer implementation, but transformer_impl="
         "{transformer_impl}: only TE's linear layers can split off the weight gradient",
         "set model.transformer_impl: transformer_engine (Megatron-LM --transformer-impl transformer_engine), "
         "or delay_wgrad_compute: false",
         MLM.format(l16=1211) + src.core("mlm-te-impl"), runtime=ALL),
    Rule("wgrad-te-min-2-3", "error", ("environment.te_version", DW), _te_2_3,
         "delay_wgrad_compute needs Transformer Engine >= 2.3.0 (the TE layers raise RuntimeError when built), "
         "found {te_version}", "upgrade Transformer Engine to >= 2.3.0 (>= 2.7.0 for the Bridge and Megatron-LM "
         "checks), or delay_wgrad_compute: false", src.core("te-layer-2-3"), runtime=ALL),
    Rule("dispatch-wgrad-excludes-ep-overlap", "error", (DISPATCH, "overlap_moe_expert_parallel_comm"),
         _dispatch_with_overlap,
         "overlap_dispatch_backward_with_experts_wgrad is an alternative to EP overlap and needs "
         "overlap_moe_expert_parallel_comm off", "keep one: overlap_moe_expert_parallel_comm (with a second "
         "micro-batch to pair) or overlap_dispatch_backward_with_experts_wgrad (within one micro-batch)",
         src.core("dispatch-wgrad-overlap"), holds=FROM_18, core=FROM_18),
    Rule("dispatch-wgrad-te-2-3", "error", (DISPATCH, "environment.te_version"), _dispatch_te,
         "overlap_dispatch_backward_with_experts_wgrad needs Transformer Engine >= 2.3.0, found {te_version}",
         "upgrade Transformer Engine to >= 2.3.0, or turn overlap_dispatch_backward_with_experts_wgrad off",
         src.core("dispatch-wgrad-te"), holds=FROM_18, core=FROM_18),
    Rule("dispatch-wgrad-excludes-delayed-wgrad", "error", (DISPATCH, DW), _dispatch_with_wgrad,
         "delay_wgrad_compute and overlap_dispatch_backward_with_experts_wgrad exclude each other",
         "keep one of the two", src.core("dispatch-wgrad-delay"), holds=FROM_18, core=FROM_18),
    Rule("wgrad-not-in-first-rollout", "warning", (DW,), _first_rollout,
         "delay_wgrad_compute is on: enable it only after plain EP overlap is verified (same loss, a speed-up), "
         "so a regression can be traced to one change",
         "first roll out with comm_overlap.delay_wgrad_compute: false, then turn it on and compare",
         "seed document (staged rollout); Megatron-Bridge EP-overlap skill"),
)
