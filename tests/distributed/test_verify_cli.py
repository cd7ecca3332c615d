"""`moe-overlap verify` input errors (exit 2, nothing launched), --print-launch, and two runs at once."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading

import pytest

from moe_overlap.skill.diagnose.logs import check_training_log
from moe_overlap.verify.api import run_verification
from moe_overlap.verify.plan.build import VerifyInputError, make_plan, prepare_out
from moe_overlap.verify.plan.options import VerifyOptions
from tests.distributed._verify_util import assert_no_orphans, assert_report_valid, new_token


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=60)


@pytest.mark.parametrize("args,needle", [
    (["--nproc", str((os.cpu_count() or 1) + 1)], "more than this machine has"),
    (["--modes", "baseline,turbo"], "unknown mode"),
    (["--steps", "1"], "--steps"),
    (["--schedule", "chunked", "--modes", "overlap+wgrad"], "needs the 1f1b schedule"),
    (["--nproc", "2", "--device", "cuda"], "cuda"),
])
def test_bad_input_exits_2_before_launch(tmp_path, args, needle):
    if "cuda" in args and subprocess.run(["sh", "-c", "nvidia-smi -L"], capture_output=True).returncode == 0:
        pytest.skip("a GPU is present")
    res = _cli(*args, "--out", str(tmp_path / "o"))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert not (tmp_path / "o" / "ranks").exists()  # nothing was launched


def test_invalid_config_exits_2(tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("format: moe-overlap\nnum_moe_experts: 3\n")  # 3 experts over 2 ranks
    res = _cli(str(cfg), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "num_moe_experts" in res.stderr
    cfg.write_text("model: [unclosed\n")
    res = _cli(str(cfg), "--out", str(tmp_path / "o"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    res = _cli(str(tmp_path / "missing.yaml"))
    assert res.returncode == 2 and "not found" in res.stderr


def test_existing_report_needs_force(tmp_path):
    from moe_overlap.verify.plan.outdir import MARKER

    (tmp_path / MARKER).write_text("{}")  # an earlier run of ours
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(VerifyInputError, match="--force"):
        make_plan(VerifyOptions(out=tmp_path))
    (tmp_path / "keep.txt").write_text("user file")
    plan = make_plan(VerifyOptions(out=tmp_path, force=True))
    assert (tmp_path / "report.json").exists()  # planning changes nothing
    prepare_out(plan)
    assert not (tmp_path / "report.json").exists() and (tmp_path / "keep.txt").exists()


def test_megatron_bridge_config_is_mapped_with_notes(tmp_path):
    cfg = tmp_path / "bridge.yaml"
    cfg.write_text("model:\n  expert_model_parallel_size: 8\n  num_moe_experts: 64\n  moe_router_topk: 8\n"
                   "  hidden_size: 2048\n  moe_token_dispatcher_type: flex\n  moe_flex_dispatcher_backend: deepep\n"
                   "  bf16: true\ncomm_overlap:\n  overlap_moe_expert_parallel_comm: true\n")
    plan = make_plan(VerifyOptions(config=str(cfg), out=tmp_path / "o"))
    assert plan.config_kind == "megatron"
    assert plan.cfg.num_moe_experts == 64 and plan.cfg.moe_router_topk == 8 and plan.cfg.precision == "bf16"
    assert plan.nproc == min(8, os.cpu_count() or 1)
    notes = " ".join(plan.mapping_notes + plan.notes)
    assert "flex" in notes and "hidden_size=2048" in notes and "expert_model_parallel_size=8" in notes
    assert [s.name for s in plan.specs] == ["baseline", "overlap"]  # delay_wgrad_compute not set


def test_print_launch(tmp_path):
    res = _cli("--nproc", "16", "--device", "cuda", "--print-launch", "torchrun", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("torchrun --nnodes 1 --nproc-per-node 16 -m moe_overlap.verify.run.worker")
    assert json.loads((tmp_path / "o" / "config.json").read_text())["expert_model_parallel_size"] == 16
    res = _cli("--nproc", "16", "--device", "cuda", "--print-launch", "slurm", "--out", str(tmp_path / "s"))
    assert res.returncode == 0 and "#SBATCH --nodes=2" in res.stdout and "srun" in res.stdout


@pytest.mark.slow
def test_two_verifications_at_once_do_not_collide(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    monkeypatch.chdir(tmp_path)  # default --out folders land here
    reports = {}

    def one(name):
        reports[name] = run_verification(VerifyOptions(steps=2, micro_batches=2, modes=["baseline", "overlap"]))

    threads = [threading.Thread(target=one, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert {r.verdict for r in reports.values()} == {"throughput-not-judged"}, [r.summary for r in reports.values()]
    assert reports["a"].out_dir != reports["b"].out_dir
    for r in reports.values():
        assert_report_valid(r.out_dir)
    assert_no_orphans(token)


@pytest.mark.slow
def test_worker_runs_under_torchrun_unchanged(tmp_path):
    """The printed torchrun command runs as is (torchrun sets RANK/WORLD_SIZE/MASTER_*; no launcher around)."""
    res = _cli("--print-launch", "torchrun", "--steps", "3", "--micro-batches", "2", "--modes", "baseline,overlap",
               "--out", str(tmp_path))
    assert res.returncode == 0, res.stderr
    cmd = shlex.split(res.stdout.strip())
    assert cmd[0] == "torchrun"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", *cmd[1:]], capture_output=True, text=True,
                         timeout=180, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    for rank in (0, 1):
        records = [json.loads(line) for line in (tmp_path / "ranks" / f"rank{rank}.jsonl").read_text().splitlines()]
        assert [r["step"] for r in records if r["kind"] == "step" and r["mode"] == "overlap"] == [0, 1, 2]
        assert records[-1]["kind"] == "done"
        log = (tmp_path / "logs" / "overlap" / f"rank{rank}.log").read_text()
        assert check_training_log(log).ok
    # the same report as a local run, judged from the records
    judged = _cli("--judge", str(tmp_path), "--format", "json")
    assert judged.returncode == 0, judged.stdout[-2000:] + judged.stderr
    assert json.loads(judged.stdout)["summary"]["verdict"] == "throughput-not-judged"  # the outcome, as over MCP
    assert_report_valid(tmp_path)
    (tmp_path / "ranks" / "rank1.jsonl").write_text("")  # a rank that never reported: not passed
    assert _cli("--judge", str(tmp_path), "--force").returncode == 1
