"""The request as the estimator uses it: defaults filled in, and every missing input named in one error.

Defaults, in order: a model preset gives the shape and the sequence length (tokens = its sequence length x
micro_batch_size, default 1); a GPU preset gives the fabric of its usual system and its NVLink domain (GPUs per
node); global_batch / (micro_batch_size x dp) gives the micro-batches per step. What is still missing after
that is reported at once, with the flag or field that supplies it (torch-free).
"""

from __future__ import annotations

from moe_overlap.skill.estimate import hardware as hw
from moe_overlap.skill.estimate.costs import micro_batches_from
from moe_overlap.skill.estimate.model import EstimateRequest
from moe_overlap.skill.estimate.models import MODELS, model_preset


class MissingInputs(ValueError):
    """Every input the estimate still lacks: (field, what gives it) pairs."""

    def __init__(self, missing: list[tuple[str, str]]):
        self.missing = missing
        self.field = missing[0][0]
        self.fix = "; ".join(f"{f}: {how}" for f, how in missing)
        super().__init__(f"{len(missing)} input(s) missing or inconsistent: " + ", ".join(f for f, _ in missing)
                         + ("" if len(missing) > 1 or "--" in missing[0][1][:2] else f" ({missing[0][1]})"))


def _gpu(req: EstimateRequest) -> hw.GpuPreset | None:
    try:
        return hw.gpu_preset(req.gpu_preset) if req.gpu_preset else None
    except hw.PresetError:
        return None  # named as a bad value by api._hardware


def resolve(req: EstimateRequest) -> EstimateRequest:
    """A copy with the defaults filled in; raises MissingInputs naming everything still missing."""
    upd: dict = {}
    missing: list[tuple[str, str]] = []
    preset = model_preset(req.model) if req.model else None
    gpu = _gpu(req)
    models = ", ".join(sorted(MODELS))
    for name in ("hidden", "moe_ffn", "experts", "topk"):
        if getattr(req, name) is None:
            missing.append((name, f"--{name.replace('_', '-')}, or --model ({models})"))
    if req.ep is None:
        missing.append(("ep", "--ep (expert-parallel degree)"))
    if req.tokens is None:
        if preset is not None:
            upd["tokens"] = preset.seq_length * (req.micro_batch_size or 1)
        else:
            missing.append(("tokens", "--tokens (sequence length x micro-batch size), or --model"))
    if req.micro_batches is None:
        m, why = micro_batches_from(req.global_batch, req.micro_batch_size, req.dp)
        if why:
            missing.append(("micro_batches", f"{why}; or give --micro-batches"))
        upd["micro_batches"] = m or 1
    if req.gpus_per_node is None:
        upd["gpus_per_node"] = gpu.nvlink_domain if gpu else 8
    if not (req.fabric or req.intra_gbps or req.calibration):
        if gpu is not None and gpu.default_fabric:
            upd["fabric"] = gpu.default_fabric
        elif req.dispatcher == "alltoall":
            missing.append(("fabric", f"--fabric ({', '.join(sorted(hw.LINKS))}, joined by '+'), --intra-gbps, "
                            "or a --gpu-preset whose system has a default fabric"))
    if not (req.gpu_preset or req.tflops or req.calibration):
        missing.append(("gpu_preset", f"--gpu-preset ({', '.join(sorted(hw.GPUS))}), --tflops, or --calibrate"))
    if missing:
        raise MissingInputs(missing)
    return req.model_copy(update=upd) if upd else req
