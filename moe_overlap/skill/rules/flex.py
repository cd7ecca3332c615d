"""Rules of the flex token dispatcher (DeepEP / HybridEP backends): ANCHORS section 1, items 19-20."""

from __future__ import annotations

from moe_overlap.skill.rules.base import FLEX_SRC, Ctx, Rule, Unchecked
from moe_overlap.skill.rules.flex_backend import backend_supported


def _backend_without_flex(c: Ctx):
    backend, kind = c["moe_flex_dispatcher_backend"], c["moe_token_dispatcher_type"]
    return {} if backend is not None and kind != "flex" else None


def _gpu_support(c: Ctx):
    if c["moe_token_dispatcher_type"] != "flex":
        return None
    backend = c["moe_flex_dispatcher_backend"] or "deepep"  # Megatron-Core's default backend
    if backend not in ("deepep", "hybridep"):
        return None
    ok = backend_supported(backend, c.env.gpu_name, c.env.compute_capability)
    if ok is None:
        what = "GPU unknown" if c.env.compute_capability is None else "GPU name needed to tell B200 from GB200"
        return Unchecked(f"{what}, so {backend} support could not be checked; give --gpu NAME (e.g. H100)")
    if ok:
        return None
    return {"backend": backend, "gpu": c.env.gpu_name or "?", "cc": c.env.compute_capability}


RULES: tuple[Rule, ...] = (
    Rule("flex-backend-needs-flex-dispatcher", "warning", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _backend_without_flex,
         "moe_flex_dispatcher_backend={moe_flex_dispatcher_backend} has no effect while moe_token_dispatcher_type="
         "{moe_token_dispatcher_type}", "also set model.moe_token_dispatcher_type: flex (Bridge's "
         "apply_flex_dispatcher_backend sets type, backend and moe_shared_expert_overlap: false together)",
         FLEX_SRC, bridge=True),
    Rule("flex-backend-gpu-support", "error", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _gpu_support,
         "the {backend} flex backend does not support GPU {gpu} (compute capability {cc})",
         "DeepEP needs compute capability 8.x/9.x or B200/B300; HybridEP 8.x/9.x/10.x. Use "
         "moe_token_dispatcher_type: alltoall on this GPU (Bridge's apply_flex_dispatcher_backend falls back to it)",
         FLEX_SRC, bridge=True),
)
