"""`moe-overlap verify --print-launch torchrun|slurm`: the command that runs the same verification on a
cluster, instead of running it here (torch-free).

The worker reads the standard torch.distributed environment, so torchrun (or Slurm + torchrun) starts it
unchanged across nodes. Every rank writes its records and logs under the shared --out folder; ``moe-overlap
verify --judge OUT`` then writes the same report as a local run (offline.py).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

from moe_overlap.verify.plan.build import Plan, VerifyInputError

# The interpreter and package that made the plan: the batch script runs the same ones on the nodes (a shared
# filesystem, as --out needs too).
_BIN = os.path.dirname(sys.executable)
_PKG_PARENT = str(Path(__file__).resolve().parents[3])


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


def cluster_shape(plan: Plan, nodes: int | None = None, per_node: int | None = None) -> tuple[int, int]:
    """(nodes, ranks per node) for `plan.nproc` ranks: given ones must multiply to nproc; on cuda the default is
    8 GPUs a node, on cpu one node (ranks are processes, not devices)."""
    if nodes is None and per_node is None:
        per_node = min(plan.nproc, 8) if plan.device == "cuda" else plan.nproc
    if nodes is None:
        nodes = max(1, -(-plan.nproc // per_node))
    if per_node is None:
        per_node = max(1, plan.nproc // nodes)
    if nodes * per_node != plan.nproc:
        raise VerifyInputError(f"--nodes {nodes} x --gpus-per-node {per_node} is not --nproc {plan.nproc}",
                               field="nodes", fix=f"give --nodes and --gpus-per-node whose product is {plan.nproc}")
    return nodes, per_node


def torchrun_command(plan: Plan, *, nnodes: int = 1, nproc_per_node: int | None = None,
                     config_path: str | None = None, rdzv: bool | None = None, rdzv_id: str | None = None,
                     extra: list[str] = ()) -> str:
    """The torchrun line; with several nodes (or `rdzv`) a c10d rendezvous at $MASTER_ADDR:$MASTER_PORT that
    every node's agent joins (the group ranks follow the order the agents join, so no --node-rank is needed)."""
    config_path = config_path or str(plan.out / "config.json")
    per_node = nproc_per_node or plan.nproc
    head = ["torchrun", "--nnodes", str(nnodes), "--nproc-per-node", str(per_node)]
    if nnodes > 1 if rdzv is None else rdzv:
        head += ["--rdzv-backend", "c10d", "--rdzv-endpoint", "$MASTER_ADDR:$MASTER_PORT",
                 "--rdzv-id", rdzv_id or (f"moe-overlap-{plan.run_id}" if plan.run_id else "moe-overlap-verify")]
    parts = [shlex.quote(p) if not p.startswith("$") else p for p in head + _worker_args(plan, config_path) + list(extra)]
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(rank_environment(plan).items())]
    return " ".join(env + parts)


def slurm_script(plan: Plan, *, nodes: int | None = None, gpus_per_node: int | None = None,
                 partition: str | None = None, account: str | None = None, time_limit: str | None = None,
                 timeout_s: float = 1800.0, extra: list[str] = ()) -> str:
    """The sbatch script: one `srun` task per node, each a torchrun agent joining one c10d rendezvous.
    `moe-overlap verify --launcher slurm` submits exactly this script (written as OUT/job.sbatch)."""
    nodes, per_node = cluster_shape(plan, nodes, gpus_per_node)
    cmd = torchrun_command(plan, nnodes=nodes, nproc_per_node=per_node, rdzv=True, rdzv_id="$SLURM_JOB_ID",
                           extra=extra)
    out = shlex.quote(str(plan.out))
    minutes = max(1, -(-int(timeout_s) // 60))
    lines = [
        "#!/bin/bash",
        "#SBATCH --job-name=moe-overlap-verify",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={per_node}" if plan.device == "cuda" else f"#SBATCH --cpus-per-task={per_node}",
        f"#SBATCH --time={time_limit or f'{minutes // 60:02d}:{minutes % 60:02d}:00'}",
        f"#SBATCH --output={out}/slurm-%j.out",
        *([f"#SBATCH --partition={partition}"] if partition else []),
        *([f"#SBATCH --account={account}"] if account else []),
        "set -euo pipefail",
        "# The rendezvous host is the first node of the allocation; the port is the job's own, so two jobs",
        "# sharing a node do not meet at each other's rendezvous.",
        'export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        "export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))",
        "export CUDA_DEVICE_MAX_CONNECTIONS=32  # the overlap needs >1 hardware queue (Megatron-LM PR 6311)",
        "export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # one thread a rank: gloo ranks share the node's cores",
        "export PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1  # records and tracebacks reach the files at once",
        f"export PATH={shlex.quote(_BIN)}:$PATH  # the Python that made this plan (torchrun, moe_overlap)",
        f"export PYTHONPATH={shlex.quote(_PKG_PARENT)}${{PYTHONPATH:+:$PYTHONPATH}}",
        "unset MOE_OVERLAP_VERIFY_PARENT_PID  # a local launcher's pid means nothing on the nodes",
        f"mkdir -p {out}",
        "# config.json (the effective VerifyConfig) and plan.json were written into --out beside this script;",
        "# --out must be on a filesystem every node sees: every rank writes its records and logs there.",
        f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 {cmd}",
        "# then, from any node that sees the folder (moe-overlap verify --launcher slurm does it itself):",
        f"#   moe-overlap verify --judge {out}",
        "",
    ]
    return "\n".join(lines)
