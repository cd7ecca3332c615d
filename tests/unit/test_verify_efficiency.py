"""The overlap efficiency is a share of the communication hidden: at most 1 in report.json, report.md and the
summary; a step that got shorter by more than the communication says so apart (torch-free)."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_overlap.verify.judge.analysis_model import hidden_share
from moe_overlap.verify.judge.criteria import criterion_throughput
from moe_overlap.verify.judge.explain import build_analysis
from moe_overlap.verify.judge.report import render_markdown
from moe_overlap.verify.judge.report_model import ModeRun, RunEnvironment, StepRecord, VerificationReport
from moe_overlap.verify.judge.summary import verification_summary
from moe_overlap.verify.plan.config import VerifyConfig

CFG = VerifyConfig(precision="bf16", micro_batches=4, num_layers=2)
H200_EP1 = Path(__file__).resolve().parents[2] / "benchmarks/results/h200_2026-12-02_checks/verify_ep1_report.json"


def _run(mode, step_s, n=12):
    steps = [StepRecord(step=i, loss=5.0, loss_hex=(5.0).hex(), step_time_s=step_s * (1 + 0.002 * ((i * 7919) % 5 - 2)),
                        tokens_per_s=1000 / step_s, peak_memory_bytes=2**30, optimizer_s=0.001) for i in range(n)]
    return ModeRun(mode=mode, schedule="none" if mode == "baseline" else "1f1b",
                   overlap_moe_expert_parallel_comm=mode != "baseline", delay_wgrad_compute=mode == "overlap+wgrad",
                   status="completed", steps=steps)


def _pieces(comm_s):
    return {"comm_s": comm_s, "a2a_s": comm_s * 0.9, "count_exchange_s": comm_s * 0.1, "experts_s": 0.030,
            "experts_fwd_s": 0.01, "experts_dgrad_s": 0.01, "experts_wgrad_s": 0.01,
            "probe": {"a2a_s": 0.004, "experts_s": 0.006, "both_s": 0.008, "overlap_efficiency": 0.5},
            "a2a_bytes_off_rank": 2**20, "rows_received": 4096, "expert_flops": int(2e12), "a2a_calls": 32,
            "count_exchanges": 8, "rounds": 3, "layers": 2, "micro_batches": 4, "model_of": "baseline"}


def _report(runs, comm_s):
    tp = criterion_throughput(runs, "cuda", True)
    a = build_analysis(CFG, nproc=2, device="cuda", backend="nccl", fabric="native",
                       transport="nccl (the process group's own)", runs=runs, throughput=tp,
                       pieces_record=_pieces(comm_s), schedules={"baseline": "none", "overlap": "1f1b",
                                                                 "overlap+wgrad": "1f1b"})
    return VerificationReport(verdict="passed", summary="s", started_at="t", elapsed_s=1.0, config_source="x",
                              config={}, modes=[r.mode for r in runs], criteria=[tp], runs=runs, analysis=a,
                              out_dir="/tmp/x", environment=RunEnvironment(device="cuda", backend="nccl", nproc=2,
                                                                           python="3", platform="p", hostname="h"))


def _table_efficiencies(md: str) -> dict[str, str]:
    """mode -> the overlap efficiency cell of report.md's "Where the step time goes" table."""
    part = md.split("## Where the step time goes", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1:-1] for line in part.splitlines()[2:]]
    return {r[0].strip(): r[6].strip() for r in rows}


def test_a_gain_larger_than_the_communication_caps_the_share_and_says_so():
    # Step 100 -> 80 ms while the all-to-alls take 10: 10 ms hidden at most, 10 ms more from elsewhere.
    rep = _report([_run("baseline", 0.100), _run("overlap+wgrad", 0.080)], comm_s=0.010)
    row = rep.analysis.modes[1]
    assert row.overlap_efficiency == 1.0
    assert row.gain_beyond_comm_s == pytest.approx(0.010, rel=0.05)
    assert row.hidden_comm_s == pytest.approx(0.010)
    md = render_markdown(rep)
    assert _table_efficiencies(md)["overlap+wgrad"] == "1.00\\*"
    assert "The gain exceeds the all-to-all time" in md and "the 10.0 ms beyond that" in md
    line = verification_summary(rep).modes[1]
    assert line.overlap_efficiency == 1.0 and line.gain_beyond_comm_ms == pytest.approx(10.0, rel=0.05)


def test_a_gain_within_the_communication_is_unchanged():
    rep = _report([_run("baseline", 0.100), _run("overlap", 0.095)], comm_s=0.020)
    row = rep.analysis.modes[1]
    assert row.overlap_efficiency == pytest.approx(0.25, abs=0.05)  # (80 + 20 - 95) / 20, as before the cap
    assert row.gain_beyond_comm_s is None
    md = render_markdown(rep)
    assert _table_efficiencies(md)["overlap"] == f"{row.overlap_efficiency:.2f}"
    assert "The gain exceeds" not in md and verification_summary(rep).modes[1].gain_beyond_comm_ms is None


@pytest.mark.parametrize(("step", "compute", "comm", "eff", "beyond"), [
    (0.095, 0.080, 0.020, 0.25, None), (0.100, 0.080, 0.020, 0.0, None), (0.110, 0.080, 0.020, -0.5, None),
    (0.080, 0.080, 0.020, 1.0, None), (0.070, 0.080, 0.020, 1.0, 0.010), (0.050, 0.020, 0.080, 1.0, 0.030),
    (0.100, 0.100, 0.0, None, None), (None, 0.08, 0.02, None, None)])
def test_hidden_share_definition(step, compute, comm, eff, beyond):
    got_eff, got_beyond = hidden_share(step, compute, comm)
    assert got_eff == (None if eff is None else pytest.approx(eff))
    assert got_beyond == (None if beyond is None else pytest.approx(beyond))


def test_the_committed_h200_report_renders_no_efficiency_above_one():
    # Written before the cap: its JSON holds 4.199 for overlap+wgrad (3.4 ms gain, 0.8 ms of all-to-alls).
    rep = VerificationReport.model_validate_json(H200_EP1.read_text(encoding="utf-8"))
    assert max(m.overlap_efficiency for m in rep.analysis.modes) > 1  # the case this guards against
    md = render_markdown(rep)
    cells = _table_efficiencies(md)
    assert set(cells) == {"baseline", "overlap", "overlap+wgrad"}
    assert all(float(c.rstrip("\\*")) <= 1.0 for c in cells.values())
    assert cells["overlap+wgrad"] == "1.00\\*" and "overlap+wgrad: the step got 3.4 ms shorter" in md
    assert all(m.overlap_efficiency <= 1.0 for m in verification_summary(rep).modes)
