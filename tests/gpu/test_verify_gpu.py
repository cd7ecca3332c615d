"""`moe-overlap verify --device cuda` end to end: the report's throughput judgement, its split of the step time
measured in the ranks, the prediction beside the measured ratio; with 2 GPUs also --fabric emulated-net and
--a2a ce. Skipped without CUDA (tests/conftest.py); the 2-GPU cases also need two devices."""

from __future__ import annotations

import pytest
import torch

from moe_overlap.verify.api import run_verification
from moe_overlap.verify.plan.options import VerifyOptions
from tests.distributed._verify_util import assert_report_valid

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _check(report, out, nproc: int) -> None:
    assert report.verdict in ("passed", "failed", "inconclusive"), report.summary
    assert_report_valid(out)
    by_id = {c.id: c for c in report.criteria}
    assert by_id["throughput"].binding and by_id["completes-cleanly"].status == "pass"
    assert by_id["loss-trajectory"].status == "pass", by_id["loss-trajectory"].summary
    a = report.analysis
    assert a.available and a.pieces.experts_s > 0 and a.pieces.model_of == "baseline"
    for row in a.modes:
        assert row.compute_s is not None and row.exposed_comm_s is not None and row.peak_memory_bytes > 0
    # The host issue time, per step and per layer alone; on CUDA the latter feeds the estimator's host floor.
    assert all(s.host_issue_s is not None and s.host_issue_s <= s.step_time_s for r in report.runs for s in r.steps)
    assert 0 < a.pieces.layer_host_s <= a.pieces.layer_s and a.pieces.host_ms_per_layer > 0
    if nproc > 1:
        assert a.pieces.comm_s > 0 and a.prediction.available, a.prediction.reason
        assert a.prediction.host_ms == a.pieces.host_ms_per_layer and a.prediction.request["host_ms"] > 0
        assert all(r.predicted_ratio for r in a.modes[1:]) and a.explanation is not None
    else:
        assert not a.prediction.available and "EP 1" in a.prediction.reason


def test_verify_on_cuda(tmp_path):
    nproc = min(2, _gpus())
    report = run_verification(VerifyOptions(device="cuda", nproc=nproc, steps=6, micro_batches=2,
                                            out=tmp_path / "run"))
    _check(report, tmp_path / "run", nproc)
    env = report.environment
    assert env.backend == "nccl"
    # The default transport: copy engines when the ranks share a host with peer access (two GPUs here), and
    # the process group's own all-to-all at EP 1 (there is none to move).
    want = "auto: copy engines" if nproc > 1 else "nccl"
    assert env.a2a_transport.startswith(want), env.a2a_transport


@pytest.mark.parametrize("opts", [{"fabric": "emulated-net"}, {"a2a": "ce"}])
def test_verify_on_two_gpus_with_fabric_or_transport(tmp_path, opts):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    report = run_verification(VerifyOptions(device="cuda", nproc=2, steps=6, micro_batches=2, out=tmp_path / "run",
                                            **opts))
    _check(report, tmp_path / "run", 2)
    env = report.environment
    if "fabric" in opts:
        assert env.fabric == "emulated-net"
    else:
        assert env.a2a_transport.startswith("ce: copy engines"), env.a2a_transport


def test_one_gpu_is_an_ep1_check_not_failed_by_its_own_downgrade(tmp_path, monkeypatch):
    """Issue 28: `moe-overlap verify --device cuda` on one GPU (the others hidden from the plan): the GPU-sized
    embedded model at EP 1, never FAILED by the tool's EP change, GEMMs (not the host) filling the step."""
    from moe_overlap.verify.plan import build

    monkeypatch.setattr(build, "cuda_device_count", lambda: 1)
    report = run_verification(VerifyOptions(device="cuda", out=tmp_path / "run"))
    assert report.verdict == "throughput-not-judged", report.summary
    assert report.notes[0].startswith(build.EP1_CHECK)
    steps = [s for r in report.runs for s in r.steps[1:]]
    assert max(s.host_issue_s / s.step_time_s for s in steps) < 0.5, [(s.host_issue_s, s.step_time_s) for s in steps]


def test_two_gpus_baseline_takes_the_faster_transport(tmp_path):
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    report = run_verification(VerifyOptions(device="cuda", nproc=2, steps=6, micro_batches=2, out=tmp_path / "run"))
    env = report.environment
    times = env.a2a_alone_ms
    assert set(times) == {"nccl", "ce"}, env
    assert env.baseline_transport.startswith(min(times, key=times.get) + ": the faster alone"), env
