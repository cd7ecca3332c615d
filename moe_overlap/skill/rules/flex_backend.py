"""Turning on the flex token dispatcher (DeepEP / HybridEP / NCCL EP) the way Megatron-Bridge's
``apply_flex_dispatcher_backend`` does: dispatcher type flex, the backend, shared-expert overlap off;
on a GPU the backend does not support, fall back to alltoall with a note (megatron-bridge 0.6.2
src/megatron/bridge/training/flex_dispatcher_backend.py:33-99). Bridge's config validation
(validate_flex_dispatcher_backend, same file :102-126) raises ValueError instead when type flex was set by hand.
"""

from __future__ import annotations

import copy
from typing import Any

from moe_overlap.skill.rules.environment import parse_gpu

BACKENDS = ("deepep", "hybridep")  # what generate picks from; ncclep (0.19+) only on request


def backend_supported(backend: str, gpu_name: str | None, capability: str | None) -> bool | None:
    """Bridge's GPU gate. None when it cannot be decided from what is known.

    DeepEP: compute capability 8.x or 9.x, or a B200/B300 by name. HybridEP: 8.x, 9.x or 10.x.
    NCCL EP (ncclep, megatron-core >= 0.19): 9.x or 10.x.
    """
    if capability is None:
        return None
    major = int(capability.split(".")[0])
    if backend == "deepep":
        if major in (8, 9):
            return True
        if gpu_name is not None:
            words = gpu_name.upper().replace("NVIDIA", "").split()
            return bool(words) and words[0] in ("B200", "B300")
        # 10.x without a name could be B200 (supported) or GB200 (not): undecidable.
        return None if major == 10 else False
    if backend == "hybridep":
        return major in (8, 9, 10)
    if backend == "ncclep":
        return major in (9, 10)
    return None


def apply_flex_dispatcher_backend(config: dict[str, Any], backend: str | None,
                                  gpu: str | None = None) -> tuple[dict[str, Any], list[str]]:
    """A copy of `config` (nested, with a `model:` section) with flex activated; plus notes for the user."""
    new = copy.deepcopy(config)
    model = new.setdefault("model", {})
    notes: list[str] = []
    experts = model.get("num_moe_experts")
    if not experts:
        notes.append("num_moe_experts is not set or 0: not an MoE model, flex dispatcher not applied")
        return new, notes
    if backend not in (*BACKENDS, "ncclep"):  # Bridge applies ncclep too (flex_dispatcher_backend.py:80-88)
        notes.append(f"{backend!r} is not a flex dispatcher backend ({', '.join(BACKENDS)}, ncclep): nothing changed")
        return new, notes
    name, capability = parse_gpu(gpu) if gpu else (None, None)
    supported = backend_supported(backend, name, capability) if gpu else None
    if supported is False:
        model["moe_token_dispatcher_type"] = "alltoall"
        model["moe_flex_dispatcher_backend"] = None
        notes.append(f"{backend} does not support GPU {gpu} (compute capability {capability}): "
                     "fell back to moe_token_dispatcher_type=alltoall, as Megatron-Bridge does")
        return new, notes
    model["moe_token_dispatcher_type"] = "flex"
    model["moe_flex_dispatcher_backend"] = backend
    model["moe_shared_expert_overlap"] = False
    if gpu is None:
        notes.append(f"GPU not given: {backend} support not checked. On the training node Bridge's "
                     "apply_flex_dispatcher_backend falls back to alltoall on an unsupported GPU, while a config "
                     "that sets moe_token_dispatcher_type: flex itself fails Bridge's validation (ValueError)")
    elif supported is None:
        notes.append(f"cannot tell whether {backend} supports GPU {gpu}: give the full name (e.g. B200, GB200)")
    return new, notes
