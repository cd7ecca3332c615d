"""`moe-overlap verify --device cuda` on a machine with one GPU (simulated: the plan's GPU count is patched).

The embedded config asks for EP 2; one GPU cannot run it, so the tool runs an EP 1 check, says so first, and
judges it by what applies at EP 1: its own EP change never fails validation, and throughput (nothing to
overlap at EP 1) is measured, not judged. The same on CPU is unchanged."""

from __future__ import annotations

import time

import pytest

from moe_overlap.verify import api
from moe_overlap.verify.plan import build
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.run.launcher import LaunchResult


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(build, "cuda_device_count", lambda: n)
    return set_count


def test_one_gpu_runs_a_labelled_ep1_check_of_a_gpu_sized_model(gpus, tmp_path):
    gpus(1)
    plan = build.make_plan(VerifyOptions(device="cuda", out=tmp_path / "o"))
    assert plan.nproc == 1 and plan.cfg.expert_model_parallel_size == 1 and build.ep1_check(plan)
    assert plan.notes[0].startswith(build.EP1_CHECK)  # said up front, with the ways to verify the overlap
    assert "cannot be verified" in plan.notes[0] and "--nproc 2" in plan.notes[0] and "--device cpu" in plan.notes[0]
    # GPU-sized: GEMMs, not Python, dominate the step (verify_gpu.yaml's shape)
    c = plan.cfg
    assert (c.hidden_size, c.moe_ffn_hidden_size, c.num_moe_experts, c.moe_router_topk) == (2048, 4096, 64, 8)
    assert c.seq_length * c.micro_batch_size == 4096 and c.precision == "bf16"
    validation = build.validate_modes(plan)
    assert all(r["valid"] for r in validation["results"].values()), validation
    assert {w["rule"] for w in validation["waived"]} == {"ep-size-gt-1"}


def _records(plan, slowdown: float) -> dict[int, list[dict]]:
    """Rank 0's records of a finished run: the overlap modes `slowdown` times the baseline's step time (the
    issue's one-H200 run had x0.950 / x0.916), losses bitwise equal."""
    recs = [{"kind": "init", "transport": "nccl (the process group's own)"}]
    for spec in plan.specs:
        recs.append({"kind": "mode_start", "mode": spec.name})
    for step in range(plan.cfg.steps):
        for spec in plan.specs:
            t = 0.1 * (1.0 if not spec.overlap else slowdown) * (1 + 0.001 * (step % 3))
            loss = 5.0 - 0.1 * step
            recs.append({"kind": "step", "mode": spec.name, "step": step, "loss": loss, "loss_hex": loss.hex(),
                         "step_time_s": t, "tokens_per_s": 8192 / t, "peak_memory_bytes": 1 << 30,
                         "host_issue_s": 0.3 * t})
    for spec in plan.specs:
        recs.append({"kind": "mode_end", "mode": spec.name, "notes": []})
    return {0: recs}


def _judge(plan, slowdown: float):
    build.prepare_out(plan)
    result = LaunchResult(status="completed", records=_records(plan, slowdown), returncodes={0: 0})
    return api.build_report(plan, result, build.validate_modes(plan), started_at="t", t0=time.monotonic(),
                            command=None)


def test_the_ep1_check_is_never_failed_by_its_own_downgrade(gpus, tmp_path):
    gpus(1)
    plan = build.make_plan(VerifyOptions(device="cuda", out=tmp_path / "o"))
    report = _judge(plan, slowdown=1.09)  # slower at EP 1, as measured on one H200: still not a failure
    by_id = {c.id: c for c in report.criteria}
    assert report.verdict == "throughput-not-judged", report.summary
    assert by_id["config-validation"].status == "pass"
    assert not by_id["throughput"].binding and by_id["throughput"].status == "fail"  # measured, reported
    assert any(n.startswith(build.EP1_CHECK) for n in report.notes)


def test_two_gpus_judge_throughput_as_before(gpus, tmp_path):
    gpus(2)
    plan = build.make_plan(VerifyOptions(device="cuda", out=tmp_path / "o"))
    assert plan.nproc == 2 and not build.ep1_check(plan) and plan.cfg.num_moe_experts == 64
    report = _judge(plan, slowdown=1.09)
    assert report.verdict == "failed" and next(c for c in report.criteria if c.id == "throughput").binding


def test_an_explicit_nproc_1_is_the_users_choice_not_the_check(gpus, tmp_path):
    gpus(1)
    plan = build.make_plan(VerifyOptions(device="cuda", nproc=1, out=tmp_path / "o"))
    assert not build.ep1_check(plan)


def test_cpu_is_unchanged(tmp_path, monkeypatch):
    monkeypatch.setattr(build.os, "cpu_count", lambda: 1)
    plan = build.make_plan(VerifyOptions(device="cpu", out=tmp_path / "o"))
    assert plan.cfg.hidden_size == 64 and plan.cfg.precision == "fp32" and not build.ep1_check(plan)
    assert any("more than this machine has (1); running EP 1" in n for n in plan.notes)
    monkeypatch.setattr(build.os, "cpu_count", lambda: 2)
    two = build.make_plan(VerifyOptions(device="cpu", out=tmp_path / "p"))
    assert (two.cfg.num_moe_experts, two.cfg.hidden_size, two.cfg.steps) == (4, 64, 16)


def test_the_gpu_default_divides_its_experts_for_any_rank_count(gpus, tmp_path):
    gpus(8)
    plan = build.make_plan(VerifyOptions(device="cuda", nproc=3, out=tmp_path / "o"))
    assert plan.cfg.num_moe_experts % 3 == 0 and plan.cfg.num_moe_experts >= plan.cfg.moe_router_topk
