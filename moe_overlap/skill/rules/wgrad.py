"""Rules of delayed weight-gradient computation (`delay_wgrad_compute`): ANCHORS section 1, items 15-18,
plus the Megatron-Core 0.16 checks the anchors do not list."""

from __future__ import annotations

from moe_overlap.skill.rules.base import BRIDGE_SRC, CORE_SRC, Ctx, Rule, Unchecked, needs_version

ALL = ((0, 0), (99, 99))
DW = "delay_wgrad_compute"


def _te(c: Ctx, minimum: str, why: str):
    ok = needs_version("te", c.env.te_version, minimum, why)
    return ok if isinstance(ok, Unchecked) else (None if ok else {"te_version": c.env.te_version})


def _requires_overlap(c: Ctx):
    return {} if c.wgrad and not c.overlap else None


def _grad_reduce_te(c: Ctx):
    if not (c.wgrad and c["overlap_grad_reduce"]):
        return None
    return _te(c, "2.7.0", "delayed wgrad with overlap_grad_reduce")


def _accum_fusion_te(c: Ctx):
    # Bridge checks `gradient_accumulation_fusion is True`: an unset value is not checked there either.
    if not (c.wgrad and c["gradient_accumulation_fusion"] is True):
        return None
    return _te(c, "2.7.0", "delayed wgrad with gradient_accumulation_fusion")


def _scope_flags(c: Ctx) -> tuple[bool, bool]:
    scope = c["cuda_graph_scope"] or []
    attn = "attn" in scope
    router = ("moe_router" in scope and c["moe_shared_expert_intermediate_size"] is not None
              and not c["moe_shared_expert_overlap"])
    return attn, router


def _graph_te_2_12(c: Ctx):
    if not c.wgrad or c["cuda_graph_impl"] == "none":
        return None  # no graph is captured, whatever the scope says
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
        problems.append("gradient_accumulation_fusion is not true")
    if attn and (c["add_bias_linear"] or c["add_qkv_bias"]):
        problems.append("attention has a bias (add_bias_linear or add_qkv_bias)")
    return {"problems": "; ".join(problems)} if problems else None


def _graph_te_2_10(c: Ctx):
    if not (c.wgrad and c["cuda_graph_impl"] == "transformer_engine"):
        return None
    return _te(c, "2.10.0", "delayed wgrad with transformer_engine CUDA graphs")


def _legacy_gemm(c: Ctx):
    return {} if c.wgrad and c["moe_use_legacy_grouped_gemm"] else None


def _first_rollout(c: Ctx):
    return {} if c.wgrad and c.overlap else None


RULES: tuple[Rule, ...] = (
    Rule("wgrad-requires-overlap", "error", (DW, "overlap_moe_expert_parallel_comm"), _requires_overlap,
         "delay_wgrad_compute only works together with overlap_moe_expert_parallel_comm, which is off",
         "set comm_overlap.overlap_moe_expert_parallel_comm: true, or delay_wgrad_compute: false",
         CORE_SRC, core=ALL, bridge=True),
    Rule("wgrad-overlap-grad-reduce-te-2-7", "error", ("overlap_grad_reduce", DW), _grad_reduce_te,
         "delayed wgrad with overlap_grad_reduce needs Transformer Engine >= 2.7.0, found {te_version}",
         "upgrade Transformer Engine to >= 2.7.0, or set ddp.overlap_grad_reduce: false",
         BRIDGE_SRC, bridge=True),
    Rule("wgrad-grad-accum-fusion-te-2-7", "error", ("gradient_accumulation_fusion", DW), _accum_fusion_te,
         "delayed wgrad with gradient_accumulation_fusion needs Transformer Engine >= 2.7.0, found {te_version}",
         "upgrade Transformer Engine to >= 2.7.0, or set model.gradient_accumulation_fusion: false",
         BRIDGE_SRC, bridge=True),
    Rule("wgrad-cuda-graph-te-2-12", "error", ("cuda_graph_scope", DW, "cuda_graph_impl"), _graph_te_2_12,
         "the delayed wgrad falls inside a CUDA graph (scope {cuda_graph_scope}): {problems}",
         "use Transformer Engine >= 2.12.0 with gradient_accumulation_fusion: true and no attention bias, "
         "or drop attn / moe_router from the CUDA graph scope", BRIDGE_SRC, bridge=True),
    Rule("wgrad-cuda-graph-te-2-10", "error", ("cuda_graph_impl", DW), _graph_te_2_10,
         "delayed wgrad with cuda_graph_impl=transformer_engine needs Transformer Engine >= 2.10.0 "
         "(megatron-core 0.16), found {te_version}", "upgrade Transformer Engine to >= 2.10.0, or turn CUDA graphs off",
         CORE_SRC, holds=((0, 16), (0, 16)), core=((0, 16), (0, 16))),
    Rule("wgrad-no-legacy-grouped-gemm", "error", ("moe_use_legacy_grouped_gemm", DW), _legacy_gemm,
         "delay_wgrad_compute does not work with the legacy grouped GEMM (moe_use_legacy_grouped_gemm=true)",
         "set model.moe_use_legacy_grouped_gemm: false", CORE_SRC, core=ALL),
    Rule("wgrad-not-in-first-rollout", "warning", (DW,), _first_rollout,
         "delay_wgrad_compute is on: enable it only after plain EP overlap is verified (same loss, a speed-up), "
         "so a regression can be traced to one change",
         "first roll out with comm_overlap.delay_wgrad_compute: false, then turn it on and compare",
         "seed document (staged rollout); Megatron-Bridge EP-overlap skill"),
)
