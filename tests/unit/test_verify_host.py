"""The host issue time of a verification run: recorded per step and per layer, fed to the estimator's host floor
on CUDA only, carried by report.json (schema'd), report.md, the summary and `estimate --from-run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from moe_overlap.verify.calibrate.run_calibration import calibration_from_run
from moe_overlap.verify.judge.criteria import criterion_throughput
from moe_overlap.verify.judge.explain import build_analysis
from moe_overlap.verify.judge.report import render_markdown
from moe_overlap.verify.judge.report_model import ModeRun, RunEnvironment, StepRecord, VerificationReport
from moe_overlap.verify.judge.summary import verification_summary
from moe_overlap.verify.plan.config import VerifyConfig

CFG = VerifyConfig(precision="bf16", micro_batches=4, num_layers=2)
LAYER_STEPS = 2 * 4
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "verification-report.schema.json"


def _run(mode, step_s, host_s=None, n=12):
    steps = [StepRecord(step=i, loss=5.0 - 0.1 * i, loss_hex=(5.0 - 0.1 * i).hex(),
                        step_time_s=step_s * (1 + 0.002 * ((i * 7919) % 5 - 2)), tokens_per_s=1000 / step_s,
                        peak_memory_bytes=2**30, optimizer_s=0.001, host_issue_s=host_s) for i in range(n)]
    return ModeRun(mode=mode, schedule="none" if mode == "baseline" else "1f1b",
                   overlap_moe_expert_parallel_comm=mode != "baseline", delay_wgrad_compute=mode == "overlap+wgrad",
                   status="completed", steps=steps)


def _pieces(host_ms_per_layer=None, comm_s=0.020, probe_eff=1.0):
    a2a, exp = 0.004, 0.006
    out = {"comm_s": comm_s, "a2a_s": comm_s * 0.9, "count_exchange_s": comm_s * 0.1, "experts_s": 0.030,
           "experts_fwd_s": 0.010, "experts_dgrad_s": 0.010, "experts_wgrad_s": 0.010,
           "probe": {"a2a_s": a2a, "experts_s": exp, "both_s": a2a + exp - probe_eff * min(a2a, exp),
                     "overlap_efficiency": probe_eff},
           "a2a_bytes_off_rank": 32 * 2**20, "rows_received": 4096, "expert_flops": int(2e12), "a2a_calls": 32,
           "count_exchanges": 8, "rounds": 3, "layers": 2, "micro_batches": 4, "model_of": "baseline"}
    if host_ms_per_layer is not None:
        layer_host = host_ms_per_layer * LAYER_STEPS / 1e3
        out.update(layer_s=layer_host * 1.02, layer_host_s=layer_host, host_ms_per_layer=host_ms_per_layer)
    return out


def _analysis(runs, pieces, device):
    tp = criterion_throughput(runs, device, device == "cuda")
    a = build_analysis(CFG, nproc=2, device=device, backend="nccl" if device == "cuda" else "gloo",
                       fabric="native", transport="nccl (the process group's own)", runs=runs, throughput=tp,
                       pieces_record=pieces, schedules={"baseline": "none", "overlap": "1f1b", "overlap+wgrad": "1f1b"})
    return a, tp


def _report(runs, a, tp, device="cuda"):
    return VerificationReport(
        verdict="failed" if tp.status == "fail" else "inconclusive", summary="criteria: throughput", started_at="t",
        elapsed_s=1.0, config_source="x", config=CFG.model_dump(), modes=[r.mode for r in runs], criteria=[tp],
        runs=runs, analysis=a, out_dir="/tmp/x",
        environment=RunEnvironment(device=device, backend="nccl" if device == "cuda" else "gloo", nproc=2,
                                   python="3", platform="p", hostname="h"))


# A 100 ms baseline step whose 8 layer-steps the host needs 12.3 ms each to issue: 98% of the GPU's 99 ms.
HOST_BOUND_MS = 0.099 / LAYER_STEPS * 1e3 * 0.99


def test_a_host_time_near_the_gpu_step_gives_a_host_bound_prediction_and_says_so():
    runs = [_run("baseline", 0.100, 0.097), _run("overlap", 0.101, 0.099), _run("overlap+wgrad", 0.101, 0.099)]
    free, _ = _analysis(runs, _pieces(), "cuda")  # no host time recorded: the GPU timeline alone
    assert free.modes[1].predicted_ratio > 1.05 and not free.prediction.host_bound
    a, tp = _analysis(runs, _pieces(HOST_BOUND_MS), "cuda")
    pr = a.prediction
    assert pr.host_ms == pytest.approx(HOST_BOUND_MS) and pr.request["host_ms"] == pytest.approx(HOST_BOUND_MS)
    assert {"1f1b", "1f1b+wgrad"} <= set(pr.host_bound)  # none: 99% of its GPU timeline, not above it
    # The host sets the pace: no overlap schedule is predicted faster than the baseline (each issues more).
    from moe_overlap.skill.estimate.host import HOST_FACTORS

    for row, name in zip(a.modes[1:], ("1f1b", "1f1b+wgrad"), strict=True):
        # at most the pair's host excess below the baseline (none's step is 99% of its host time here)
        assert 1 / HOST_FACTORS["sm"][name] - 0.01 <= row.predicted_ratio <= 1.0
    assert pr.host_note.startswith("host-bound: overlap cannot help")
    e = a.explanation
    assert e.pays is False and e.cause.startswith("host-bound: overlap cannot help") and "Cut host work" not in e.cause
    assert any("CUDA graphs" in x for x in e.what_would_change_it)
    assert a.modes[0].host_issue_s == pytest.approx(0.097) and a.modes[1].host_issue_s == pytest.approx(0.099)
    report = _report(runs, a, tp)
    md = render_markdown(report)
    assert "Host: host-bound: overlap cannot help" in md and "the estimator's host_ms" in md
    assert "Host issue time per step" in md and "baseline 97.0 of" in md
    s = verification_summary(report)
    assert s.why.startswith("host-bound") and s.modes[0].host_issue_ms == pytest.approx(97.0)


def test_a_floor_that_binds_only_for_the_overlap_schedules_still_says_host_bound():
    # 88% of the no-overlap GPU timeline: below the estimator's 95% note, above 1f1b's shorter timeline once
    # its host factor (x1.177, NCCL) applies.
    runs = [_run("baseline", 0.100, 0.090), _run("overlap", 0.101, 0.095)]
    a, _ = _analysis(runs, _pieces(0.099 / LAYER_STEPS * 1e3 * 0.88), "cuda")
    assert "1f1b" in a.prediction.host_bound and "none" not in a.prediction.host_bound
    assert not a.prediction.host_note.startswith("host-bound")
    assert a.explanation.cause.startswith("host-bound: overlap cannot help overlap") and "x1.177" in a.explanation.cause


def test_a_cpu_run_never_claims_host_bound():
    runs = [_run("baseline", 0.100, 0.099), _run("overlap", 0.101, 0.100)]
    a, tp = _analysis(runs, _pieces(HOST_BOUND_MS * 1.2), "cpu")
    pr = a.prediction
    assert pr.available and pr.host_ms is None and not pr.host_bound and "host_ms" not in pr.request
    assert pr.host_note.startswith("no host floor on CPU")
    assert "host-bound" not in a.explanation.cause
    assert not any("CUDA graphs" in x for x in a.explanation.what_would_change_it)
    md = render_markdown(_report(runs, a, tp, device="cpu"))
    assert "host-bound" not in md and "Host: no host floor on CPU" in md


def test_an_older_run_without_host_times_still_explains():
    runs = [_run("baseline", 0.100), _run("overlap", 0.101)]
    a, tp = _analysis(runs, _pieces(), "cuda")
    assert a.prediction.available and a.prediction.host_ms is None and "not recorded" in a.prediction.host_note
    assert a.modes[0].host_issue_s is None
    md = render_markdown(_report(runs, a, tp))
    assert "Host issue time per step" not in md and "the estimator's host_ms" not in md


def _write_run(tmp_path, pieces, device="cuda"):
    env = {"backend": "nccl" if device == "cuda" else "gloo", "nproc": 2}
    if device is not None:
        env["device"] = device
    report = {"format": "moe-overlap-verification-report", "config": {"precision": "bf16"}, "environment": env,
              "analysis": {"pieces": pieces}}
    (tmp_path / "report.json").write_text(json.dumps(report))
    return tmp_path


def test_from_run_feeds_the_host_floor_on_cuda_only(tmp_path):
    from moe_overlap.skill.estimate.api import estimate_overlap_benefit, parse_request

    # 5 ms per layer to issue, against about 1.6 ms of GPU work per layer and micro-batch at this shape.
    cal, _ = calibration_from_run(_write_run(tmp_path, _pieces(5.0), "cuda"))
    assert cal.host_ms == pytest.approx(5.0) and "host floor 5.000 ms" in cal.source
    small = {"hidden": 256, "moe_ffn": 512, "experts": 8, "topk": 2, "tokens": 512, "ep": 2, "micro_batches": 4,
             "precision": "bf16", "calibration": cal.model_dump()}
    result = estimate_overlap_benefit(parse_request(small))
    assert any(r.startswith("host-bound: overlap cannot help") for r in result.reasons)
    assert all(s.host_bound for s in result.schedules)
    cpu, _ = calibration_from_run(_write_run(tmp_path, _pieces(5.0), "cpu"))
    assert cpu.host_ms is None and "CPU run" in cpu.source
    old, _ = calibration_from_run(_write_run(tmp_path, _pieces(), "cuda"))  # a run before the field
    assert old.host_ms is None and "not recorded" in old.source
    older, _ = calibration_from_run(_write_run(tmp_path, _pieces(), None))  # no environment.device either
    assert older.host_ms is None


def test_cli_from_run_on_runs_with_and_without_the_field(tmp_path, capsys):
    from moe_overlap.cli import main

    args = ["estimate", "--hidden", "256", "--moe-ffn", "512", "--experts", "8", "--topk", "2", "--tokens", "512",
            "--ep", "2", "--micro-batches", "4", "--format", "json", "--from-run"]
    assert main(args + [str(_write_run(tmp_path, _pieces(), "cuda"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"].get("host_ms") is None and not any("host-bound" in r for r in out["reasons"])
    assert main(args + [str(_write_run(tmp_path, _pieces(5.0), "cuda"))]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["hardware"]["host_ms"] == pytest.approx(5.0) and any("host-bound" in r for r in out["reasons"])


@pytest.mark.parametrize("with_host", [True, False])
def test_report_validates_against_the_schema_with_and_without_the_fields(with_host):
    host = 0.097 if with_host else None
    runs = [_run("baseline", 0.100, host), _run("overlap", 0.101, host)]
    a, tp = _analysis(runs, _pieces(HOST_BOUND_MS if with_host else None), "cuda")
    data = json.loads(_report(runs, a, tp).model_dump_json())
    if not with_host:  # as an older report.json has them: absent, not null
        for run in data["runs"]:
            for step in run["steps"]:
                del step["host_issue_s"]
        for row in data["analysis"]["modes"]:
            del row["host_issue_s"]
        for key in ("layer_s", "layer_host_s", "host_ms_per_layer"):
            del data["analysis"]["pieces"][key]
        for key in ("host_ms", "host_bound", "host_note"):
            del data["analysis"]["prediction"][key]
    Draft202012Validator(json.loads(SCHEMA.read_text())).validate(data)
    assert VerificationReport.model_validate(data).analysis.pieces.host_ms_per_layer == (HOST_BOUND_MS if with_host
                                                                                       else None)
    bad = json.loads(json.dumps(data))
    bad["runs"][0]["steps"][0]["host_issue_s"] = -1.0
    with pytest.raises(Exception, match="minimum|-1"):
        Draft202012Validator(json.loads(SCHEMA.read_text())).validate(bad)


def test_step_result_stamps_the_issue_time_after_the_gradient_reduction(monkeypatch, tmp_path):
    """forward_backward's issued_at: after reduce_gradients (its last queued work), before it returns."""
    import time

    import torch.distributed as dist

    from moe_overlap.ep import step as ep_step
    from moe_overlap.ep.model import ModelConfig, MoETransformer

    reduced = []
    real = ep_step.reduce_gradients
    monkeypatch.setattr(ep_step, "reduce_gradients",
                        lambda model, group: (real(model, group), reduced.append(time.perf_counter())))
    # One gloo rank: the step's gradient reduction is a collective.
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        _check_issue_stamps(ep_step, MoETransformer(ModelConfig(), dist.group.WORLD), ModelConfig(), reduced)
    finally:
        dist.destroy_process_group()


def _check_issue_stamps(ep_step, model, cfg, reduced) -> None:
    import time

    import torch
    import torch.distributed as dist

    gen = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, cfg.vocab_size, (2, 8), generator=gen),) * 2 for _ in range(2)]
    for schedule, delay in (("none", False), ("1f1b", True), ("chunked", False)):
        before = time.perf_counter()
        result = ep_step.forward_backward(model, batches, schedule=schedule, delay_wgrad=delay, chunks=2,
                                          group=dist.group.WORLD)
        after = time.perf_counter()
        assert result.issued_at is not None and reduced and before <= reduced[-1] <= result.issued_at <= after
