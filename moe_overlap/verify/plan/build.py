"""Everything decided before a rank starts: config, ranks, modes, output folder, validation (torch-free).

The config travels one way: read and mapped once (config.load_verify_config: a Megatron source parsed once into
the skill's OverlapConfig on the way), parsed once into the skill's model when the source is ours
(validated_config), and every mode's validation runs on that parse (validate_parsed), never on a source again.

Bad input raises :class:`VerifyInputError` here, before anything is launched (the CLI's exit 2).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from moe_overlap.skill.config.model import OverlapConfig, parse_config
from moe_overlap.skill.rules.validate import validate_parsed
from moe_overlap.verify.plan.config import VerifyConfig, VerifyConfigError, load_verify_config
from moe_overlap.verify.plan.modes import ModeError, ModeSpec, resolve_modes
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.plan.outdir import OutDirError, check, claim, new_default_folder

# Rules that constrain Megatron-Core's implementation, not the included one, when the run is ours:
WAIVERS = {
    "precision-bf16-or-fp16": "the included implementation overlaps in fp32 too (fp32 is what makes the loss "
                              "comparison bitwise); Megatron-Core would reject this config: set precision: bf16 "
                              "to verify it as Megatron runs it",
}


# The embedded model on --device cuda: benchmarks/configs/verify_gpu.yaml's shape (Qwen3-30B-A3B's hidden size
# and top-8; 64 experts so that EP 1, 2, 4 and 8 divide them; 4096 tokens per micro-batch). The CPU default (hidden
# 64, 4 experts) is pure host work on a GPU: on one H200 the host took 36.1 of a 36.6 ms step to issue it, so its
# throughput said nothing about the GPU; at this shape the expert GEMMs (about 9 ms per layer and micro-batch on
# an H200, docs/benchmarks.md) dominate the step.
GPU_DEFAULT = {"hidden_size": 2048, "moe_ffn_hidden_size": 4096, "num_moe_experts": 64, "moe_router_topk": 8,
               "num_layers": 2, "num_attention_heads": 16, "seq_length": 2048, "micro_batch_size": 2,
               "micro_batches": 4, "steps": 12, "lr": 1e-3, "precision": "bf16"}
# The first note of a run the tool itself took down to EP 1 on one GPU (ep1_check): persisted in plan.json, so a
# re-judged run is judged alike.
EP1_CHECK = "EP 1 check:"


def ep1_check(plan: Plan) -> bool:
    """A run at EP 1 on one GPU because the machine has no second one (not asked for): EP overlap cannot be
    verified there (no all-to-all to hide), so it is judged as a check of the overlap modes' machinery."""
    return plan.device == "cuda" and plan.nproc == 1 and any(n.startswith(EP1_CHECK) for n in plan.notes)

EP1_WAIVER = ("the EP 1 check on one GPU: the run's EP 1 is this tool's choice (the machine has one GPU), not the "
              "config's; run on two or more GPUs to validate and verify the overlap at the config's EP")


class VerifyInputError(ValueError):
    """Bad input found before launching: a message naming the field, and the fix (exit 2)."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None):
        super().__init__(message)
        self.message, self.field, self.fix = message, field, fix


@dataclass
class Plan:
    cfg: VerifyConfig
    config_source: str
    config_kind: str  # default | moe-overlap | megatron
    raw_source: Any
    megatron: OverlapConfig  # what criterion 1 validates, in the skill's model (see validated_config)
    nproc: int
    device: str
    specs: list[ModeSpec]
    out: Path
    notes: list[str] = field(default_factory=list)
    mapping_notes: list[str] = field(default_factory=list)
    fabric: str = "native"  # ep/fabric.py: the NCCL environment of every rank
    a2a: str | None = None  # ep/transport.py kind; None: the process group's own all-to-all
    sm_margin: int | str = "auto"  # ep/sm_margin.py: an int, or "auto" (resolved in each rank)
    explain: bool = True  # time the step's pieces alone after training (verify/calibrate/pieces.py)
    max_steps: int = 0  # steps per mode at most (throughput not settled after cfg.steps); 0: cfg.steps
    force: bool = False  # --force: an earlier run's outputs in `out` may be replaced
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])


def cuda_device_count() -> int:
    """GPUs visible to a child process, without importing torch here (the MCP server stays light)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        count = sum(1 for line in out.stdout.splitlines() if line.startswith("GPU ")) if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired):
        count = 0
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def machine_capacity(device: str) -> int:
    return cuda_device_count() if device == "cuda" else (os.cpu_count() or 1)


def _out_dir(options: VerifyOptions) -> Path:
    """The run's folder, checked (outdir.check) but not touched: it is created or taken in prepare_out."""
    if options.out is None:
        # Unique per run: two verifications at once never share a folder.
        return new_default_folder(Path.cwd() / "verify-out")
    out = Path(options.out).expanduser()
    try:
        check(out, force=options.force)
    except OutDirError as exc:
        raise VerifyInputError(exc.message, field="out", fix=exc.fix) from None
    except OSError as exc:
        raise VerifyInputError(f"--out {out}: cannot be read ({exc.strerror or exc})", field="out",
                               fix="choose a folder you can write to") from None
    return out


def validated_config(cfg: VerifyConfig, parsed: OverlapConfig | None) -> OverlapConfig:
    """What the validator checks: a Megatron source as parsed (the user's config, before this machine's
    adjustments), else the Megatron view of the run config (parsed here, the one parse of an own source)."""
    return parsed if parsed is not None else parse_config(cfg.megatron_view())


def make_plan(options: VerifyOptions, *, local: bool = True) -> Plan:
    """`local=False` (--print-launch): ranks are not limited by this machine."""
    try:
        loaded = load_verify_config(options.config)
    except VerifyConfigError as exc:
        raise VerifyInputError(exc.message, field=exc.field, fix=exc.fix) from None
    cfg, kind = loaded.cfg, loaded.kind
    notes: list[str] = []
    updates: dict[str, Any] = {}
    if kind == "default" and options.device == "cuda":
        updates.update(GPU_DEFAULT)
        cfg = VerifyConfig(**{**cfg.model_dump(), **GPU_DEFAULT})
        notes.append("embedded model on --device cuda: GPU-sized, benchmarks/configs/verify_gpu.yaml's shape (hidden "
                     "2048, ffn 4096, 64 experts, top-8, 4096 tokens per micro-batch), precision bf16")
    if options.steps is not None:
        updates["steps"] = options.steps
    if options.micro_batches is not None:
        updates["micro_batches"] = options.micro_batches
    capacity = machine_capacity(options.device) if local else 1 << 20
    if local and options.device == "cuda" and capacity == 0:
        raise VerifyInputError("--device cuda: no CUDA GPU is visible on this machine", field="device",
                               fix="use --device cpu")
    if options.nproc is not None:
        nproc = options.nproc
        if nproc > capacity:
            what = "GPUs" if options.device == "cuda" else "CPU cores"
            raise VerifyInputError(f"--nproc {nproc} is more than this machine has ({capacity} {what})",
                                   field="nproc", fix=f"use --nproc {capacity} or fewer")
    else:
        nproc = min(cfg.expert_model_parallel_size, capacity)
        if nproc < cfg.expert_model_parallel_size and options.device == "cuda" and nproc == 1:
            notes.insert(0, f"{EP1_CHECK} this machine has one GPU, so EP overlap cannot be verified here (at EP 1 "
                            "there is no all-to-all to hide). This run is a check of the overlap modes at EP 1: "
                            "they run, complete and match the baseline's losses; throughput is measured, not judged; "
                            f"the validator's EP > 1 rule is waived (the config asks for EP "
                            f"{cfg.expert_model_parallel_size}). To verify the overlap: a machine with 2 or more "
                            "GPUs (--nproc 2), or --device cpu (CPU ranks over gloo)")
        elif nproc < cfg.expert_model_parallel_size:
            notes.append(f"expert_model_parallel_size={cfg.expert_model_parallel_size} is more than this machine "
                         f"has ({capacity}); running EP {nproc}")
    if nproc != cfg.expert_model_parallel_size:
        updates["expert_model_parallel_size"] = nproc
    if kind == "default" and options.device == "cuda" and cfg.precision == "fp32":  # (unless GPU_DEFAULT set it)
        # The embedded model's fp32 default exists for the bitwise CPU check; on GPU verify what Megatron-Core
        # runs (its overlap requires bf16 or fp16). A user config keeps the precision it gives.
        updates["precision"] = "bf16"
        notes.append("embedded model on --device cuda: precision bf16 (pass a config with precision: fp32 "
                     "for an fp32 run)")
    if kind == "default" and cfg.num_moe_experts % nproc:
        # The embedded model keeps two experts per rank whatever the rank count (a user config is not rescaled),
        # or as many as its top-k needs.
        per_rank = max(2, -(-cfg.moe_router_topk // nproc))
        updates["num_moe_experts"] = per_rank * nproc
        notes.append(f"embedded model: num_moe_experts={per_rank * nproc} ({per_rank} per rank for --nproc {nproc})")
    try:
        cfg = VerifyConfig(**{**cfg.model_dump(), **updates})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise VerifyInputError(f"invalid run: {err['msg']}", field="nproc",
                               fix="choose --nproc dividing num_moe_experts") from None
    if options.max_steps is not None and options.max_steps < cfg.steps:
        raise VerifyInputError(f"--max-steps {options.max_steps} is below --steps {cfg.steps}", field="max_steps",
                               fix=f"give --max-steps {cfg.steps} or more, or leave it out")
    # Throughput is judged only on CUDA: only there is it worth running longer to settle it.
    max_steps = (options.max_steps if options.max_steps is not None
                 else min(5 * cfg.steps, cfg.steps + 200) if options.device == "cuda" else cfg.steps)
    if options.device != "cuda" and options.fabric != "native":
        raise VerifyInputError(f"--fabric {options.fabric} sets NCCL's transport: it needs --device cuda",
                               field="fabric", fix="add --device cuda, or drop --fabric")
    if options.device != "cuda" and options.a2a == "ce":
        raise VerifyInputError("--a2a ce copies between GPUs with their copy engines: it needs --device cuda",
                               field="a2a", fix="add --device cuda, or drop --a2a (CPU ranks use gloo)")
    if options.device != "cuda" and options.a2a == "nccl":  # CPU ranks run gloo: a report saying nccl would lie
        raise VerifyInputError("--a2a nccl needs --device cuda: CPU ranks run gloo's all-to-all",
                               field="a2a", fix="add --device cuda, or drop --a2a (CPU ranks use gloo)")
    if options.device != "cuda" and options.sm_margin not in ("auto", 0):
        raise VerifyInputError(f"--sm-margin {options.sm_margin} sizes the GPU GEMMs: it needs --device cuda",
                               field="sm_margin", fix="add --device cuda, or drop --sm-margin")
    try:
        specs, mode_notes = resolve_modes(cfg, options.modes, options.schedule)
    except ModeError as exc:
        raise VerifyInputError(exc.message, field=exc.field, fix=exc.fix) from None
    source = ("embedded default" if options.config is None else "dict" if isinstance(options.config, dict)
              else str(options.config))
    return Plan(cfg=cfg, config_source=source, config_kind=kind, raw_source=options.config,
                megatron=validated_config(cfg, loaded.parsed), nproc=nproc, device=options.device, specs=specs,
                out=_out_dir(options), notes=notes + mode_notes, mapping_notes=loaded.notes, fabric=options.fabric,
                a2a=options.a2a, sm_margin=options.sm_margin, explain=options.explain, max_steps=max_steps, force=options.force)


def prepare_out(plan: Plan) -> Path:
    """Take the output folder (outdir.claim: created, or an empty / earlier-run folder of ours, marked) and write
    config.json (what the ranks read); an --out that cannot be used is bad input, found before anything runs."""
    try:
        plan.out = claim(plan.out, force=plan.force, run_id=plan.run_id)
        path = plan.out / "config.json"
        with open(path, "x", encoding="utf-8") as f:
            f.write(plan.cfg.model_dump_json(indent=2) + "\n")
    except OutDirError as exc:
        raise VerifyInputError(exc.message, field="out", fix=exc.fix) from None
    except OSError as exc:
        raise VerifyInputError(f"--out {plan.out}: cannot write there ({exc.strerror or exc})", field="out",
                               fix="choose a folder you can write to") from None
    return path


def validate_modes(plan: Plan) -> dict[str, Any]:
    """Criterion 1's evidence: the validator's result for the config of every overlap mode (the mode's
    overlap switches set in comm_overlap, which overrides the model's as in Bridge)."""
    results, waived = {}, []
    for spec in plan.specs:
        if not spec.overlap:
            continue
        comm = plan.megatron.comm_overlap.model_copy(update={"overlap_moe_expert_parallel_comm": spec.overlap,
                                                            "delay_wgrad_compute": spec.delay_wgrad})
        res = validate_parsed(plan.megatron.model_copy(update={"comm_overlap": comm})).model_dump(mode="json")
        for f in res.get("findings", []):
            if f.get("severity") == "error" and plan.config_kind != "megatron" and f.get("rule") in WAIVERS:
                f["waived"] = True
                waived.append({"mode": spec.name, "rule": f["rule"], "reason": WAIVERS[f["rule"]]})
            elif f.get("severity") == "error" and f.get("rule") == "ep-size-gt-1" and ep1_check(plan):
                f["waived"] = True  # the tool's own change on one GPU, never the config's fault
                waived.append({"mode": spec.name, "rule": f["rule"], "reason": EP1_WAIVER})
        res["valid"] = not any(f.get("severity") == "error" and not f.get("waived") for f in res.get("findings", []))
        results[spec.name] = res
    # "source" keeps the validator's public name in reports (validate_config is validate_parsed after one parse).
    return {"available": True, "source": "moe_overlap.skill.rules.validate.validate_config", "results": results,
            "waived": waived}
