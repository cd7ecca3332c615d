"""`moe-overlap verify --print-launch torchrun|slurm`: the command that runs the same verification on a
cluster, instead of running it here (torch-free).

The worker reads the standard torch.distributed environment, so torchrun (or Slurm + torchrun) starts it
unchanged across nodes. Every rank writes its records and logs under the shared --out folder; ``moe-overlap
verify --judge OUT`` then writes the same report as a local run (offline.py).
"""

from __future__ import annotations

import json
import shlex

from moe_overlap.verify.plan.build import Plan


def worker_options(plan: Plan) -> list[str]:
    """The worker flags beyond config, modes, out and device (the same for the launcher and torchrun)."""
    out = ["--fabric", plan.fabric] if plan.fabric != "native" else []
    out += ["--a2a", plan.a2a] if plan.a2a else []
    out += ["--sm-margin", str(plan.sm_margin)] if plan.sm_margin != "auto" else []
    out += ["--max-steps", str(plan.max_steps)] if plan.max_steps > plan.cfg.steps else []
    return out + ([] if plan.explain else ["--no-explain"])


def rank_environment(plan: Plan) -> dict[str, str]:
    """What every rank's environment needs before init_process_group: the NCCL fabric (ep/fabric.py)."""
    from moe_overlap.ep.fabric import fabric_env

    return fabric_env(plan.fabric)


def _worker_args(plan: Plan, config_path: str) -> list[str]:
    modes = json.dumps([s.to_dict() for s in plan.specs], separators=(",", ":"))
    return ["-m", "moe_overlap.verify.run.worker", "--config", config_path, "--modes", modes,
            "--out", str(plan.out), "--device", plan.device, *worker_options(plan)]


def torchrun_command(plan: Plan, *, nnodes: int = 1, nproc_per_node: int | None = None,
                     config_path: str | None = None) -> str:
    config_path = config_path or str(plan.out / "config.json")
    per_node = nproc_per_node or plan.nproc
    head = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(per_node)]
    if nnodes > 1:
        head += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:29500", "--rdzv-id", "moe-overlap-verify"]
    parts = [shlex.quote(p) if not p.startswith("$") else p for p in head + _worker_args(plan, config_path)]
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(rank_environment(plan).items())]
    return " ".join(env + parts)


def slurm_script(plan: Plan, *, gpus_per_node: int = 8) -> str:
    nodes = max(1, -(-plan.nproc // gpus_per_node))
    per_node = min(plan.nproc, gpus_per_node)
    cmd = torchrun_command(plan, nnodes=nodes, nproc_per_node=per_node)
    return "\n".join([
        "#!/bin/bash",
        "#SBATCH --job-name=moe-overlap-verify",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}" if plan.device == "cuda" else f"#SBATCH --cpus-per-task={per_node}",
        "#SBATCH --time=00:30:00",
        "set -euo pipefail",
        "# The rendezvous host is the first node of the allocation.",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export CUDA_DEVICE_MAX_CONNECTIONS=32  # the overlap needs >1 hardware queue (Megatron-LM PR 6311)",
        f"mkdir -p {shlex.quote(str(plan.out))}",
        "# config.json (the effective VerifyConfig) and plan.json were written by:",
        f"#   moe-overlap verify --nproc {plan.nproc} --print-launch torchrun --out {shlex.quote(str(plan.out))}",
        f"srun --ntasks-per-node=1 {cmd}",
        "# then, from any node that sees the folder:",
        f"#   moe-overlap verify --judge {shlex.quote(str(plan.out))}",
        "",
    ])
