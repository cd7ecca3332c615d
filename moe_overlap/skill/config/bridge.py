"""How Megatron-Bridge's CommOverlapConfig reads the overlap switches: a value set in `comm_overlap:` is written onto
the model, and with a `comm_overlap:` section every switch it leaves unset is written as False, whatever the model
says (megatron-bridge 0.6.2 src/megatron/bridge/training/comm_overlap.py:438-439 defaults, :559 user values,
:618 applied to the model). Without the section the model's own values stay. Its delayed-wgrad check reads
`ddp.overlap_grad_reduce or comm_overlap.overlap_grad_reduce` (:521). Torch-free; reads a parsed OverlapConfig.
"""

from __future__ import annotations

from typing import Any

OVERLAP_FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


def overlap_flags(cfg: Any) -> dict[str, tuple[bool, str | None]]:
    """Each switch's effective value and, where it is not the model's own, the path it comes from."""
    given = "comm_overlap" in cfg.model_fields_set
    out: dict[str, tuple[bool, str | None]] = {}
    for name in OVERLAP_FLAGS:
        override = getattr(cfg.comm_overlap, name)
        if override is not None:
            out[name] = (override, f"comm_overlap.{name}")
        elif given or name not in cfg.model.model_fields_set:
            out[name] = (False if given else getattr(cfg.model, name), f"comm_overlap.{name}")
        else:
            out[name] = (getattr(cfg.model, name), None)
    return out


def flags_turned_off(cfg: Any) -> list[tuple[str, str]]:
    """(path, message) for model.<flag>: true beside a comm_overlap section that leaves <flag> unset."""
    if "comm_overlap" not in cfg.model_fields_set:
        return []
    return [(f"model.{name}", f"model.{name}=true is turned off: with a comm_overlap section, Megatron-Bridge's "
             f"CommOverlapConfig sets {name} on the model to comm_overlap.{name}, False when unset (megatron-bridge "
             f"0.6.2 comm_overlap.py:438-439, :618); set comm_overlap.{name}: true")
            for name in OVERLAP_FLAGS if getattr(cfg.model, name) and getattr(cfg.comm_overlap, name) is None]


def grad_reduce(cfg: Any) -> tuple[bool, str]:
    """overlap_grad_reduce as Bridge's delayed-wgrad check reads it: on in either section is on."""
    override = cfg.comm_overlap.overlap_grad_reduce
    return (bool(override) or cfg.ddp.overlap_grad_reduce,
            "comm_overlap.overlap_grad_reduce" if override else "ddp.overlap_grad_reduce")
