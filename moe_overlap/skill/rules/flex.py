"""Rules of the flex token dispatcher (DeepEP / HybridEP / NCCL EP backends): Megatron-Bridge's GPU gate
(flex_dispatcher_backend.py), Core's TransformerConfig checks of the deprecated moe_enable_deepep switch and of
ncclep, and the backend-without-flex pitfall. Sources per release in sources.py."""

from __future__ import annotations

from moe_overlap.skill.rules import sources as src
from moe_overlap.skill.rules.base import ALL, Ctx, Rule, Unchecked
from moe_overlap.skill.rules.flex_backend import backend_supported

FROM_19 = ((0, 19), (99, 99))
BEFORE_19 = ((0, 0), (0, 18))


def _backend_without_flex(c: Ctx):
    backend, kind = c["moe_flex_dispatcher_backend"], c["moe_token_dispatcher_type"]
    # ncclep without flex and moe_enable_deepep without flex are errors of their own.
    if backend in ("deepep", "hybridep") and kind != "flex" and not c["moe_enable_deepep"]:
        return {}
    return None


def _gpu_support(c: Ctx):
    if c["moe_token_dispatcher_type"] != "flex":
        return None
    backend = c["moe_flex_dispatcher_backend"] or "deepep"  # Megatron-Core's default backend
    if backend not in ("deepep", "hybridep", "ncclep"):
        return None
    ok = backend_supported(backend, c.env.gpu_name, c.env.compute_capability)
    if ok is None:
        what = "GPU unknown" if c.env.compute_capability is None else "GPU name needed to tell B200 from GB200"
        return Unchecked(f"{what}, so {backend} support could not be checked; give --gpu NAME (e.g. H100)")
    if ok:
        return None
    return {"backend": backend, "gpu": c.env.gpu_name or "?", "cc": c.env.compute_capability}


def _deepep_flag_without_flex(c: Ctx):
    return {} if c["moe_enable_deepep"] and c["moe_token_dispatcher_type"] != "flex" else None


def _deepep_flag_with_hybridep(c: Ctx):
    return {} if c["moe_enable_deepep"] and c["moe_flex_dispatcher_backend"] == "hybridep" else None


def _ncclep_without_flex(c: Ctx):
    return {} if c["moe_flex_dispatcher_backend"] == "ncclep" and c["moe_token_dispatcher_type"] != "flex" else None


def _ncclep_before_19(c: Ctx):
    return {} if c["moe_flex_dispatcher_backend"] == "ncclep" and c["moe_token_dispatcher_type"] == "flex" else None


RULES: tuple[Rule, ...] = (
    Rule("flex-backend-needs-flex-dispatcher", "warning", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _backend_without_flex,
         "moe_flex_dispatcher_backend={moe_flex_dispatcher_backend} has no effect while moe_token_dispatcher_type="
         "{moe_token_dispatcher_type}", "also set model.moe_token_dispatcher_type: flex (Bridge's "
         "apply_flex_dispatcher_backend sets type, backend and moe_shared_expert_overlap: false together)",
         src.bridge("flex-apply"), bridge=True),
    Rule("flex-backend-gpu-support", "error", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _gpu_support,
         "the {backend} flex backend does not support GPU {gpu} (compute capability {cc}): Megatron-Bridge's "
         "config validation raises ValueError (only apply_flex_dispatcher_backend falls back to alltoall)",
         "DeepEP needs compute capability 8.x/9.x or B200/B300; HybridEP 8.x/9.x/10.x; NCCL EP 9.x/10.x. Use "
         "moe_token_dispatcher_type: alltoall on this GPU, or call apply_flex_dispatcher_backend, which falls "
         "back to alltoall with a warning", f"{src.bridge('flex-validate')}; {src.bridge('flex-apply')}",
         bridge=True),
    Rule("deepep-flag-needs-flex", "error", ("moe_enable_deepep", "moe_token_dispatcher_type"),
         _deepep_flag_without_flex,
         "moe_enable_deepep needs moe_token_dispatcher_type=flex, got {moe_token_dispatcher_type}: "
         "TransformerConfig raises ValueError 'DeepEP backend is only supported with flex token dispatcher'",
         "drop the deprecated moe_enable_deepep and set moe_token_dispatcher_type: flex with "
         "moe_flex_dispatcher_backend: deepep (apply_flex_dispatcher_backend does both)",
         src.core("deepep-flex"), core=ALL),
    Rule("deepep-flag-excludes-hybridep", "error", ("moe_enable_deepep", "moe_flex_dispatcher_backend"),
         _deepep_flag_with_hybridep,
         "moe_enable_deepep asks for DeepEP while moe_flex_dispatcher_backend=hybridep: TransformerConfig raises "
         "ValueError 'Only one backend is supported for flex token dispatcher'",
         "drop the deprecated moe_enable_deepep and keep moe_flex_dispatcher_backend", src.core("deepep-hybridep"),
         core=ALL),
    Rule("ncclep-needs-flex", "error", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _ncclep_without_flex,
         "moe_flex_dispatcher_backend=ncclep needs moe_token_dispatcher_type=flex, got "
         "{moe_token_dispatcher_type}: TransformerConfig raises ValueError",
         "set model.moe_token_dispatcher_type: flex (apply_flex_dispatcher_backend(cfg.model, "
         "moe_flex_dispatcher_backend='ncclep') does it and checks the GPU)", src.core("ncclep-flex"),
         holds=FROM_19, core=FROM_19),
    Rule("ncclep-needs-core-0-19", "error", ("moe_flex_dispatcher_backend", "moe_token_dispatcher_type"),
         _ncclep_before_19,
         "the ncclep flex backend exists from megatron-core 0.19; this release's flex dispatcher raises "
         "ValueError 'Invalid backend' when the model is built",
         "use deepep or hybridep, or move to megatron-core >= 0.19", src.core("flex-backend-invalid"),
         holds=BEFORE_19, runtime=BEFORE_19),
)
