"""The `--device cuda` path of `moe-overlap verify`, checked on CPU with mocks: one GPU per rank from
LOCAL_RANK, NCCL bound to that device, the machine's environment (NVLink multicast off) passed to every
rank, and bf16 as the embedded model's precision on GPU."""

from __future__ import annotations

import faulthandler
import json
import os
import signal

import pytest

from moe_overlap.verify.plan import build as plan
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.run import launcher, worker


@pytest.fixture
def eight_gpus(monkeypatch):
    monkeypatch.setattr(plan, "cuda_device_count", lambda: 8)


def test_embedded_model_runs_bf16_on_cuda_and_fp32_on_cpu(eight_gpus, tmp_path):
    gpu = plan.make_plan(VerifyOptions(device="cuda", nproc=4, out=tmp_path / "g"))
    assert gpu.cfg.precision == "bf16" and gpu.cfg.expert_model_parallel_size == 4 and gpu.nproc == 4
    assert any("precision bf16" in n for n in gpu.notes)
    cpu = plan.make_plan(VerifyOptions(device="cpu", nproc=2, out=tmp_path / "c"))
    assert cpu.cfg.precision == "fp32"


def test_a_user_config_keeps_its_precision_on_cuda(eight_gpus, tmp_path):
    cfg = {"format": "moe-overlap", "precision": "fp32", "num_moe_experts": 8}
    p = plan.make_plan(VerifyOptions(config=cfg, device="cuda", nproc=8, out=tmp_path / "o"))
    assert p.cfg.precision == "fp32" and not any("precision bf16" in n for n in p.notes)


def test_more_ranks_than_gpus_is_refused_before_launch(eight_gpus, tmp_path):
    with pytest.raises(plan.VerifyInputError, match="--nproc 16"):
        plan.make_plan(VerifyOptions(device="cuda", nproc=16, out=tmp_path / "o"))


def test_every_rank_gets_its_local_rank_and_the_parent_environment(monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "0")
    monkeypatch.setenv("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    for r in range(4):
        env = launcher._rank_env(r, 4, 29500, 1)
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"]) == (str(r), str(r), "4")
        assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"


class _Stop(Exception):
    pass


def test_worker_binds_local_rank_to_its_gpu_and_nccl(monkeypatch, tmp_path):
    import torch
    import torch.distributed as dist

    calls = {}
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("set_device", d))

    def fake_init(backend=None, **kw):
        calls["init"] = (backend, kw)
        raise _Stop("stop after init_process_group")

    def fake_exit(code):
        raise SystemExit(code)

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(worker.os, "_exit", fake_exit)
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")  # second GPU of the second node: LOCAL_RANK, not RANK, picks it
    monkeypatch.delenv(worker.PARENT_ENV, raising=False)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"format": "moe-overlap", "precision": "bf16"}))
    try:
        with pytest.raises(SystemExit) as exc:
            worker.main(["--config", str(cfg), "--modes", "baseline", "--out", str(tmp_path), "--device", "cuda"])
    finally:
        faulthandler.unregister(signal.SIGUSR1)
    assert exc.value.code == 1
    assert calls["set_device"] == 1
    backend, kw = calls["init"]
    assert backend == "nccl" and kw["rank"] == 3 and kw["world_size"] == 4
    assert kw["device_id"] == torch.device("cuda", 1)
    records = [json.loads(line) for line in (tmp_path / "ranks" / "rank3.jsonl").read_text().splitlines()]
    assert records[0]["kind"] == "hello" and records[0]["local_rank"] == 1
    assert records[-1]["kind"] == "error" and "stop after init_process_group" in records[-1]["traceback"]
    assert os.environ["LOCAL_RANK"] == "1"


@pytest.mark.parametrize("nproc", [2, 4, 8])
def test_the_gpu_sized_verify_config_plans_for_2_4_8_gpus(eight_gpus, tmp_path, nproc):
    from pathlib import Path

    cfg = Path(__file__).resolve().parents[2] / "benchmarks" / "configs" / "verify_gpu.yaml"
    p = plan.make_plan(VerifyOptions(config=str(cfg), device="cuda", nproc=nproc, out=tmp_path / "o"))
    assert p.cfg.expert_model_parallel_size == nproc and p.cfg.precision == "bf16"
    assert [s.name for s in p.specs] == ["baseline", "overlap", "overlap+wgrad"]
    assert p.cfg.num_moe_experts % nproc == 0
    # 4096 tokens per micro-batch per rank, like the layer benchmark.
    assert p.cfg.seq_length * p.cfg.micro_batch_size == 4096
    assert plan.validate_modes(p)["results"]["overlap"]["valid"]
