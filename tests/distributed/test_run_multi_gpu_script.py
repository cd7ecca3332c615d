"""benchmarks/run_multi_gpu.sh, the one-call multi-GPU sequence, run end to end in its CPU dry mode
(same steps and flags, gloo, tiny shapes, the GPU-sized verify config only planned): the script a later
session sends to the device machine blind must not die on a typo."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_dry_run_produces_every_output(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS")}
    env.update(MOE_OVERLAP_DRY_CPU="1", OUT=str(tmp_path), PYTHON=sys.executable)
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "run_multi_gpu.sh"), "2"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ep_overlap_cpu_r2.json", "ep_overlap_cpu_r2_emulated-net.json", "run_multi_gpu_all_r2.log",
        "verify_default_r2.json", "verify_r2.tar.gz"]
    # The script exports NVLink multicast off itself (removed from its environment above).
    for line in ("NCCL_NVLS_ENABLE=0", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", "NVSHMEM_DISABLE_NVLS=1"):
        assert line in log
    for name in ("ep_overlap nccl", "ep_overlap emulated-net", "verify (GPU-sized config)", "verify (embedded model)"):
        assert f"=== {name}: exit 0" in log
    net = json.loads((tmp_path / "ep_overlap_cpu_r2_emulated-net.json").read_text())
    assert net["fabric"] == "emulated-net" and net["rank_env"][0]["NCCL_P2P_DISABLE"] == "1"
    assert isinstance(net["presets"][0]["shape"]["ffn"], int)  # the balanced ffn was measured and set
    assert "torchrun --nnodes 1 --nproc-per-node 2" in log  # the GPU config was planned
    bench = json.loads((tmp_path / "ep_overlap_cpu_r2.json").read_text())
    assert bench["world"] == 2 and [p["preset"] for p in bench["presets"]] == ["tiny"]
    report = json.loads((tmp_path / "verify_default_r2.json").read_text())
    status = {c["id"]: c["status"] for c in report["criteria"]}
    assert status["completes-cleanly"] == "pass" and status["loss-trajectory"] == "pass", status
