"""Why a verification's overlap paid or did not: the step split per mode, the estimator's prediction beside
the measured ratio, and the measured cause in one sentence (torch-free; models in analysis_model.py).

Inputs: the modes' step records, the throughput comparisons (judge.py) and the pieces record rank 0 wrote
after training (verify/calibrate/pieces.py). The split's definitions are in analysis_model.py's docstring.
"""

from __future__ import annotations

import statistics
from typing import Any

from pydantic import ValidationError

from moe_overlap.skill.estimate.model import BYTES
from moe_overlap.verify.calibrate.run_calibration import calibration_from_pieces, host_floor_input
from moe_overlap.verify.judge.analysis_model import (
    Analysis,
    Explanation,
    ModeBreakdown,
    Prediction,
    StepPieces,
    hidden_share,
)
from moe_overlap.verify.judge.report_model import Criterion, ModeRun
from moe_overlap.verify.judge.throughput import WARMUP_STEPS
from moe_overlap.verify.plan.config import VerifyConfig

# Estimator schedule of each mode (verify/plan/modes.py: overlap takes the run's schedule).
_ESTIMATOR_SCHEDULE = {"none": "none", "chunked": "chunked", "1f1b": "1f1b"}
SMALL_COMM_SHARE = 0.10  # below this the all-to-all is too small a part of the step for overlap to matter
POOR_EFFICIENCY = 0.30  # below this the probe says comm and compute mostly slow each other down
NOISY_HALF_WIDTH = 0.05  # a band wider than +-5% around "no clear change" says noise, not a cause


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _kept(run: ModeRun) -> list:
    return run.steps[WARMUP_STEPS:] or run.steps


def _link_words(device: str, fabric: str, transport: str) -> str:
    if device != "cuda":
        return "gloo on CPU cores"
    if fabric == "emulated-net":
        return "NCCL's network transport (emulated inter-node link)"
    return "copy engines over NVLink" if "copy engines" in transport else "NVLink (SM-driven NCCL all-to-all)"


def margin_of(note: str | None) -> int:
    """The SMs the 1f1b expert GEMMs left, from report.json's environment.sm_margin ("8 (auto: ...)", written by
    verify/run/worker.py from ep/sm_margin.py resolve_margin); 0 when absent or unreadable."""
    head = (note or "").split(" ", 1)[0]
    return int(head) if head.isdigit() else 0


def a2a_engine(device: str, transport: str) -> str:
    """The estimator's `a2a_engine` for the overlap modes' all-to-alls. report.json's environment.a2a_transport
    reads "<asked>: <what ran> (<why>)" (verify/run/worker.py, from ep/transport.py make_transport), and what ran
    starts with "copy engines" exactly when the modes moved their bytes with copy engines (--a2a ce, or auto on
    one host with peer access); NCCL, gloo and the sync-free path are SM-driven (or CPU) all-to-alls."""
    ran = transport.split(": ", 1)[-1]
    return "copy-engine" if device == "cuda" and ran.startswith("copy engines") else "sm"


def _breakdown(runs: list[ModeRun], comparisons: dict[str, dict[str, Any]], pieces: StepPieces | None
               ) -> list[ModeBreakdown]:
    base = next((r for r in runs if r.mode == "baseline"), None)
    base_step = _median([s.step_time_s for s in _kept(base)]) if base and base.steps else None
    comm = pieces.comm_s if pieces else None
    compute = max(0.0, base_step - comm) if base_step is not None and comm is not None else None
    out = []
    for run in runs:
        kept = _kept(run)
        step = _median([s.step_time_s for s in kept])
        row = ModeBreakdown(mode=run.mode, step_s=step, tokens_per_s=_median([s.tokens_per_s for s in kept]),
                            optimizer_s=_median([s.optimizer_s for s in kept if s.optimizer_s is not None]),
                            host_issue_s=_median([s.host_issue_s for s in kept if s.host_issue_s is not None]),
                            peak_memory_bytes=int(statistics.median(s.peak_memory_bytes for s in kept))
                            if kept else None, comm_s=comm, compute_s=compute)
        c = comparisons.get(run.mode)
        if c and "ratio" in c:
            row.measured_ratio = c["ratio"]
        elif run.mode == "baseline" and run.steps:
            row.measured_ratio = 1.0
        if step is not None and compute is not None and comm is not None:
            row.exposed_comm_s = max(0.0, step - compute)
            row.hidden_comm_s = max(0.0, comm - row.exposed_comm_s)
            row.overlap_efficiency, row.gain_beyond_comm_s = hidden_share(step, compute, comm)
        out.append(row)
    return out


def _prediction(cfg: VerifyConfig, nproc: int, backend: str, pieces: StepPieces | None,
                rows: list[ModeBreakdown], specs: dict[str, str], device: str = "cpu", transport: str = "",
                sm_margin: int = 0) -> Prediction:
    from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request

    if pieces is None:
        return Prediction(available=False, reason="the step's pieces were not timed (run without --no-explain)")
    base = next((r for r in rows if r.mode == "baseline"), None)
    if base is None or base.compute_s is None:
        return Prediction(available=False, reason="no baseline step time to split")
    shape = {"hidden": cfg.hidden_size, "moe_ffn": cfg.moe_ffn_hidden_size, "tokens": cfg.micro_batch_size
             * cfg.seq_length, "topk": cfg.moe_router_topk, "bytes": BYTES[cfg.precision]}
    cal, note = calibration_from_pieces(pieces, backend=backend, world=nproc, precision=cfg.precision,
                                        source="this run", shape=shape)
    if cal is None:
        return Prediction(available=False, reason=note)
    layers_mb = cfg.num_layers * cfg.micro_batches
    optimizer = base.optimizer_s or 0.0
    # Everything the baseline computes besides the expert GEMMs and the optimizer (attention, router, gathers,
    # norms, embedding, loss) is the estimator's per-layer "attention": forward once, backward twice.
    rest = max(0.0, base.compute_s - pieces.experts_s - optimizer)
    request = {"hidden": cfg.hidden_size, "moe_ffn": cfg.moe_ffn_hidden_size, "experts": cfg.num_moe_experts,
               "topk": cfg.moe_router_topk, "tokens": cfg.micro_batch_size * cfg.seq_length, "ep": nproc,
               "micro_batches": cfg.micro_batches, "layers": cfg.num_layers, "gpus_per_node": nproc,
               "precision": cfg.precision, "chunks": max(2, cfg.chunks), "attn_ms": rest / (3 * layers_mb) * 1e3,
               "other_ms": optimizer * 1e3, "overhead_ms": 0.0, "calibration": cal.model_dump()}
    if a2a_engine(device, transport) == "copy-engine":
        # The estimator's host factors per engine (skill/estimate/host.py). Its copy-engine default efficiency
        # would also replace the probe's, which this run measured with these very copy engines: keep the probe.
        request["a2a_engine"] = "copy-engine"
        request["overlap_efficiency"] = cal.overlap_efficiency
    if sm_margin:  # the 1f1b expert GEMMs left SMs to the all-to-all: their slowdown and no stall (costs.py)
        request["sm_margin"] = sm_margin
    host_ms, host_why = host_floor_input(pieces, device)
    if host_ms is not None:
        request["host_ms"] = host_ms
    try:
        result = estimate_overlap_benefit(parse_request(request))
    except (EstimateError, ValidationError) as exc:
        return Prediction(available=False, reason=f"the estimator refused this shape: {exc}")
    steps = {s.name: s.step_ms / 1e3 for s in result.schedules}
    for row in rows:
        if row.mode == "baseline":
            continue  # the reference: its predicted ratio is 1 by definition
        name = _estimator_name(row.mode, specs)
        if name in steps and steps[name] > 0:
            row.predicted_ratio = round(steps["none"] / steps[name], 4)
            if row.measured_ratio:
                row.prediction_error = round(row.predicted_ratio / row.measured_ratio - 1.0, 4)
    bound = [s.name for s in result.schedules if s.host_bound]
    note_host = next((r for r in result.reasons if r.startswith("host-bound")), None)
    return Prediction(available=True, reason="estimator (skill/estimate) fed by this run's pieces: " + cal.source,
                      overlap_efficiency=cal.overlap_efficiency, efficiency_source=note, request=request,
                      step_s=steps, host_ms=host_ms, host_bound=bound, host_note=note_host or host_why)


def _host_bound_cause(rows: list[ModeBreakdown], prediction: Prediction | None, specs: dict[str, str]
                      ) -> str | None:
    """The estimator's host-bound wording when its floor binds for a measured overlap mode, else None."""
    if prediction is None or not prediction.host_bound or prediction.host_ms is None:
        return None
    modes = [r.mode for r in rows if r.mode != "baseline" and _estimator_name(r.mode, specs) in prediction.host_bound]
    if not modes:
        return None
    if prediction.host_note and prediction.host_note.startswith("host-bound"):
        return prediction.host_note
    from moe_overlap.skill.estimate.host import host_factor

    name = _estimator_name(modes[0], specs)
    engine = (prediction.request or {}).get("a2a_engine", "sm")
    return (f"host-bound: overlap cannot help {', '.join(modes)}. The host takes {prediction.host_ms:.3f} ms to "
            f"issue one layer's forward + backward, x{host_factor(name, 1, engine=engine):.3f} with {name}, longer than that "
            "schedule's GPU timeline, so the estimator's step is the host's issue time. Cut host work first "
            "(CUDA graphs, fewer small ops, larger micro-batches)")


def _estimator_name(mode: str, specs: dict[str, str]) -> str | None:
    return "1f1b+wgrad" if mode == "overlap+wgrad" else _ESTIMATOR_SCHEDULE.get(specs.get(mode, ""))


def _explanation(rows: list[ModeBreakdown], comparisons: dict[str, dict[str, Any]], pieces: StepPieces | None,
                 cfg: VerifyConfig, nproc: int, device: str, fabric: str, transport: str,
                 host_cause: str | None = None) -> Explanation | None:
    base = next((r for r in rows if r.mode == "baseline"), None)
    others = [r for r in rows if r.mode != "baseline" and r.measured_ratio is not None]
    if base is None or base.step_s is None or len(rows) < 2:
        return None
    link = _link_words(device, fabric, transport)
    pays = any(comparisons.get(r.mode, {}).get("change") == "faster" for r in others)
    if pieces is None or base.compute_s is None:
        return Explanation(pays=pays if others else None, cause="the step's pieces were not timed: no split to "
                                                                "explain the ratio with")
    share = pieces.comm_s / base.step_s if base.step_s else 0.0
    shorter = min(pieces.comm_s, base.compute_s)
    ceiling = base.step_s / (base.step_s - shorter) if base.step_s > shorter else None
    if not others:
        return Explanation(pays=None, comm_share=round(share, 4), ceiling_ratio=round(ceiling, 4) if ceiling else None,
                           cause=f"throughput was not compared (too few steps after the warm-up); all-to-all is "
                                 f"{share:.0%} of the step on {link}" + (f", so overlap could reach x{ceiling:.2f} "
                                                                         "at best" if ceiling else ""),
                           what_would_change_it=["more steps (--steps 8 or more) to compare the modes"])
    best = max(others, key=lambda r: r.measured_ratio)
    probe = pieces.probe.overlap_efficiency
    ms = 1e3
    if pays:
        # Above the ceiling, the overlap saved more than the all-to-alls timed alone: the sequential step also
        # waits on other things (host syncs, launch gaps) that the overlapped order fills.
        bound = (f"at most x{ceiling:.2f} if all of it were hidden" if best.measured_ratio <= ceiling else
                 f"more than the x{ceiling:.2f} of hiding all of it: the sequential step also waits on host "
                 "work that the overlapped order fills") if ceiling else ""
        cause = (f"all-to-all is {share:.0%} of the step on {link} ({pieces.comm_s * ms:.1f} of "
                 f"{base.step_s * ms:.1f} ms); {best.mode} hid {best.hidden_comm_s * ms:.1f} ms of it "
                 f"(x{best.measured_ratio:.3f}, {bound})"
                 if best.hidden_comm_s is not None and ceiling else
                 f"all-to-all is {share:.0%} of the step on {link}; {best.mode} measured x{best.measured_ratio:.3f}")
        return Explanation(pays=True, cause=cause, comm_share=round(share, 4),
                           ceiling_ratio=round(ceiling, 4) if ceiling else None)
    best_c = comparisons.get(best.mode, {})
    noisy = best_c.get("change") == "no clear change" and best_c.get("half_width", 0.0) > NOISY_HALF_WIDTH
    if host_cause:
        # The host issuing the layers sets the pace: no GPU overlap shortens a step the host has not queued.
        # (its advice goes to what_would_change_it below)
        cause = host_cause.split(". Cut host work first", 1)[0]
    elif share < SMALL_COMM_SHARE and ceiling:
        cause = (f"all-to-all is {share:.0%} of the step on {link} ({pieces.comm_s * ms:.1f} of "
                 f"{base.step_s * ms:.1f} ms); overlap can hide at most that (x{ceiling:.2f} at best)")
    elif noisy:
        steps = best_c.get("steps_to_settle")
        cause = (f"the steps are too noisy to tell: {best.mode} measured x{best.measured_ratio:.3f} with a band of "
                 f"x{best_c.get('band_low', 0):.3f}-x{best_c.get('band_high', 0):.3f}, while all-to-all is "
                 f"{share:.0%} of the step on {link}" + (f" (x{ceiling:.2f} if all of it were hidden)" if ceiling else "")
                 + (f"; about {steps} steps per mode would settle it" if steps else ""))
    elif probe is not None and probe < POOR_EFFICIENCY:
        why = ("the all-to-all kernels take SMs the expert GEMMs need" if device == "cuda" and link.startswith("NVLink")
               else "gloo's all-to-all thread competes with the compute for the same CPU cores" if device != "cuda"
               else "the transfers and the GEMMs share the GPU")
        cause = (f"all-to-all is {share:.0%} of the step on {link}, but run beside the expert GEMMs it hides "
                 f"{max(probe, 0.0):.0%} of the shorter of the two (overlap probe: {why})")
    else:
        extra = best.step_s - base.step_s if best.step_s is not None else 0.0
        cause = (f"all-to-all is {share:.0%} of the step on {link} and the probe hides "
                 f"{probe if probe is not None else 0:.0%} of it beside the GEMMs, but {best.mode}'s schedule costs "
                 f"more than it hides (step {extra * ms:+.1f} ms against the baseline: smaller kernels, waits "
                 f"between micro-batches)")
    change = []
    if host_cause:
        change.append("less host work per layer: CUDA graphs, fewer small ops, larger micro-batches (the "
                      "estimator's host floor, skill/estimate/host.py)")
    if noisy:
        steps = best_c.get("steps_to_settle")
        change.append((f"more steps (--steps {steps})" if steps else "more steps") +
                      " or a quieter machine: the step-to-step noise hides the difference")
    if share < 0.5:
        change.append(f"more EP ranks (EP {nproc} now): each all-to-all sends (N-1)/N of its rows off the rank, "
                      "and beyond one node they cross the network")
    if device == "cuda" and fabric == "native":
        change.append("an inter-node fabric: over a network link NCCL's all-to-all holds only a few SMs, which the "
                      "expert GEMMs leave to it (--sm-margin, auto), and overlaps almost fully (see it on one host "
                      "with --fabric emulated-net)")
        if "copy engines" not in transport:
            change.append("copy-engine all-to-alls (--a2a ce): NVLink transfers without SMs")
    if device != "cuda":
        change.append("GPUs (--device cuda): on CPU ranks communication and compute share the same cores")
    change.append(f"a larger batch (micro-batches {cfg.micro_batches}, {cfg.micro_batch_size * cfg.seq_length} "
                  "tokens each now): more compute to pair with each all-to-all, the same fixed costs")
    return Explanation(pays=False, cause=cause, what_would_change_it=change, comm_share=round(share, 4),
                       ceiling_ratio=round(ceiling, 4) if ceiling else None)


def build_analysis(cfg: VerifyConfig, *, nproc: int, device: str, backend: str, fabric: str, transport: str,
                   runs: list[ModeRun], throughput: Criterion | None, pieces_record: dict[str, Any] | None,
                   schedules: dict[str, str], explain: bool = True, sm_margin: int = 0) -> Analysis:
    comparisons = {c["mode"]: c for c in (throughput.evidence.get("comparisons", []) if throughput else [])}
    pieces, reason = None, None
    if pieces_record is not None:
        try:
            pieces = StepPieces.model_validate({k: v for k, v in pieces_record.items()
                                                if k in StepPieces.model_fields})
        except ValidationError as exc:
            reason = f"the pieces record is damaged: {exc.errors()[0]['msg']}"
    elif not explain:
        reason = "run with --no-explain: the step's pieces were not timed"
    else:
        reason = "no pieces record: the run stopped before the end of training"
    rows = _breakdown(runs, comparisons, pieces)
    prediction = _prediction(cfg, nproc, backend, pieces, rows, schedules, device, transport, sm_margin)
    explanation = _explanation(rows, comparisons, pieces, cfg, nproc, device, fabric, transport,
                               _host_bound_cause(rows, prediction, schedules))
    return Analysis(available=pieces is not None, reason=reason, pieces=pieces, modes=rows, prediction=prediction,
                    explanation=explanation)
