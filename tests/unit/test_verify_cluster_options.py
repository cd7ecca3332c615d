"""The cluster options of `moe-overlap verify` (--launcher, --nodes, --gpus-per-node, --partition, --account,
--time): the printed sbatch script and torchrun line, and the input errors (exit 2, nothing submitted)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError

from moe_overlap.mcp.inputs import RunVerificationInput
from moe_overlap.verify.run.progress import ProgressTracker


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", *args], capture_output=True,
                          text=True, timeout=60, env=env)


def test_print_launch_slurm_has_the_shape_and_the_scheduler_options(tmp_path):
    res = _cli("--nproc", "4", "--nodes", "2", "--gpus-per-node", "2", "--partition", "gpu-a", "--account",
               "proj.1", "--time", "01:30:00", "--print-launch", "slurm", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    script = res.stdout
    for line in ("#SBATCH --nodes=2", "#SBATCH --cpus-per-task=2", "#SBATCH --partition=gpu-a",
                 "#SBATCH --account=proj.1", "#SBATCH --time=01:30:00",
                 f"#SBATCH --output={tmp_path / 'o'}/slurm-%j.out", "export MASTER_PORT=$((20000 + SLURM_JOB_ID"):
        assert line in script, line
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert ("torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT "
            "--rdzv-id $SLURM_JOB_ID -m moe_overlap.verify.run.worker") in srun


def test_print_launch_torchrun_for_two_nodes(tmp_path):
    res = _cli("--nproc", "2", "--nodes", "2", "--print-launch", "torchrun", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d "
                                 "--rdzv-endpoint $MASTER_ADDR:$MASTER_PORT --rdzv-id moe-overlap-")


@pytest.mark.parametrize("args,needle", [
    (["--nodes", "2"], "only with --launcher slurm or --print-launch"),
    (["--nproc", "4", "--nodes", "3", "--gpus-per-node", "2", "--print-launch", "slurm"], "is not --nproc 4"),
    (["--launcher", "slurm", "--partition", "a;rm -rf /"], "--partition"),
    (["--launcher", "slurm", "--time", "soon"], "--time"),
])
def test_bad_cluster_options_exit_2(tmp_path, args, needle):
    res = _cli(*args, "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert not (tmp_path / "o" / "job.sbatch").exists()


def test_launcher_slurm_without_slurm_commands_is_an_input_error(tmp_path):
    env = {**os.environ, "PATH": os.path.dirname(sys.executable)}  # no sbatch there
    res = _cli("--launcher", "slurm", "--out", str(tmp_path / "o"), env=env)
    assert res.returncode == 2, res.stderr
    assert "`sbatch` is not on PATH" in res.stderr and "--print-launch slurm" in res.stderr
    assert not (tmp_path / "o").exists()  # nothing written, nothing submitted


def test_mcp_slurm_fields_need_the_slurm_launcher():
    with pytest.raises(ValidationError, match="launcher='slurm'"):
        RunVerificationInput(slurm={"nodes": 2})
    with pytest.raises(ValidationError):
        RunVerificationInput(launcher="slurm", slurm={"partition": "x y"})
    assert RunVerificationInput(launcher="slurm", slurm={"nodes": 2, "time": "10"}).slurm.nodes == 2


def test_progress_says_the_jobs_state_without_skipping_ahead():
    t = ProgressTracker()
    t.feed({"event": "start", "modes": ["baseline"], "steps": 2, "nproc": 2})
    p = t.feed({"event": "slurm", "job_id": "7", "state": "PENDING", "reason": "Resources"})
    assert p.message == "Slurm job 7: PENDING (Resources)" and 1 < p.done < 2
    assert t.feed({"event": "slurm", "job_id": "7", "state": "RUNNING", "reason": "None"}).message == (
        "Slurm job 7: RUNNING")
    assert t.feed({"event": "ranks"}).done == 2
