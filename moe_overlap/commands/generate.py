"""`moe-overlap generate`: a minimal working EP-overlap config, or the staged rollout plan (wiring only).

stdout of one stage in text format is exactly the rendered config (pipe it into a file); notes and
adjustments go to stderr. A malformed or unsatisfiable request exits 2 with the reason.
"""

from __future__ import annotations

import argparse
import sys

from moe_overlap.commands._common import EXIT_OK, EXIT_USAGE, CommandError, add_format_argument, emit

_FIELDS = ("ep", "experts", "topk", "dispatcher", "flex_backend", "gpu", "precision", "tp", "pp", "vpp",
           "num_layers", "micro_batches", "recompute", "model", "gpus", "stage", "to", "torch_version",
           "te_version", "megatron_core_version")


def add_arguments(p: argparse.ArgumentParser) -> None:
    from moe_overlap.skill.generate.render import FORMATS
    from moe_overlap.skill.generate.resolve import STAGES
    from moe_overlap.skill.models.shapes import MODELS

    g = p.add_argument_group("model and layout")
    g.add_argument("--ep", type=int, help="expert-parallel size (expert_model_parallel_size)")
    g.add_argument("--experts", type=int, help="number of experts (num_moe_experts)")
    g.add_argument("--topk", type=int, help="experts per token (moe_router_topk)")
    names = ", ".join(n for n, m in MODELS.items() if not m.layer_only)
    g.add_argument("--model", "--preset", dest="model", help="model preset (shape, and the Megatron-Bridge "
                   "recipe's layout at this scale) instead of --experts/--topk: " + names)
    g.add_argument("--gpus", type=int, help="total GPUs (with --model and no --ep: the recipe's EP, else "
                   "gcd(experts, GPUs / PP))")
    g.add_argument("--tp", type=int, help="tensor-parallel size (default 1)")
    g.add_argument("--pp", type=int, help="pipeline-parallel size (default 1)")
    g.add_argument("--vpp", type=int, help="virtual pipeline size (chosen for you when --pp > 1)")
    g.add_argument("--num-layers", type=int, help="layers (needed with --pp > 1 unless --model)")
    g.add_argument("--micro-batches", type=int, help="micro-batches per data-parallel rank (overlap needs >= 2)")
    g.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="default bf16 (fp32 becomes bf16)")
    g.add_argument("--recompute", choices=["none", "selective", "full"], help="activation recomputation wish")
    d = p.add_argument_group("dispatcher and environment")
    d.add_argument("--dispatcher", choices=["alltoall", "flex"],
                   help="token dispatcher (default: the Bridge recipe's for --model and --gpu, else alltoall)")
    d.add_argument("--flex-backend", choices=["deepep", "hybridep"], help="flex backend (default: by GPU)")
    d.add_argument("--gpu", help="GPU name or compute capability, e.g. H100, GB200, 9.0")
    d.add_argument("--torch-version", help="torch version of the target cluster (checked: >= 2.6.0)")
    d.add_argument("--te-version", help="Transformer Engine version of the target cluster")
    d.add_argument("--megatron-core-version", help="rule set to validate against (default: installed)")
    o = p.add_argument_group("output")
    o.add_argument("--stage", choices=list(STAGES), help="rollout stage (default overlap)")
    o.add_argument("--plan", action="store_true", help="every stage in order, with what to check before moving on")
    o.add_argument("--to", choices=list(FORMATS), help="config format (default yaml)")
    add_format_argument(p)


def _request(args: argparse.Namespace):
    from pydantic import ValidationError

    from moe_overlap.skill.generate.model import GenerateRequest

    data = {name: getattr(args, name) for name in _FIELDS if getattr(args, name, None) is not None}
    data["plan"] = bool(args.plan)
    try:
        return GenerateRequest(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise CommandError(f"--{field.replace('_', '-')}: {err['msg'].lower()}", field=field) from None


def plan_text(result) -> str:
    """The plan for people: each stage's purpose, its checks with commands, then its config."""
    lines = [f"# EP-overlap rollout plan: {len(result.stages)} stage(s), format {result.format}"]
    lines += [f"# adjusted {a.field}: {a.requested} -> {a.used} ({a.rule or 'request'}): {a.reason}"
              for a in result.adjustments]
    lines += [f"# note: {n}" for n in result.notes]
    lines.append("# environment: " + " ".join(f"{k}={v}" for k, v in result.environment.items()))
    for i, s in enumerate(result.stages, 1):
        lines += ["", f"# ===== stage {i}/{len(result.stages)}: {s.stage} =====", f"# {s.purpose}"]
        lines += [f"# note: {n}" for n in s.notes]
        lines += [f"# next: {n.text} [{n.source}]" for n in s.next]
        warn = ", ".join(s.validation.warnings) or "none"
        lines.append(f"# validation ({s.validation.rule_set}): {'valid' if s.validation.valid else 'INVALID'}; "
                     f"warnings: {warn}")
        lines.append("# check before moving on:")
        for c in s.checks:
            lines += [f"#   [{c.name}] {c.what}", f"#     $ {c.command}"]
        lines.append(s.rendered.rstrip("\n"))
    return "\n".join(lines) + "\n"


def _refused(result) -> str:
    r = result.refusal
    lines = ["error: request refused"]
    lines += [f"  {reason}" for reason in r.reasons]
    if r.nearest_command:
        lines.append(f"nearest valid request: {r.nearest_command}")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from moe_overlap.skill.generate.api import generate_config
    from moe_overlap.skill.generate.resolve import GenerateError

    req = _request(args)
    try:
        result = generate_config(req)
    except GenerateError as exc:
        raise CommandError(exc.message, field=exc.field, fix=exc.fix, choices=exc.choices) from None
    if not result.ok:
        if args.format == "json":
            emit(result, "json")
        else:
            print(_refused(result), file=sys.stderr)
        return EXIT_USAGE
    if args.format == "json":
        emit(result, "json")
        return EXIT_OK
    if req.plan:
        sys.stdout.write(plan_text(result))
        return EXIT_OK
    stage = result.stages[0]
    sys.stdout.write(stage.rendered)
    extra = [f"adjusted {a.field}: {a.requested} -> {a.used} ({a.rule or 'request'}): {a.reason}"
             for a in result.adjustments] + result.notes + stage.notes
    extra += [f"validation warning: {m}" for m in stage.validation.messages]
    extra += [f"next: {n.text} [{n.source}]" for n in stage.next]
    for line in extra:
        print(f"# {line}", file=sys.stderr)
    return EXIT_OK
