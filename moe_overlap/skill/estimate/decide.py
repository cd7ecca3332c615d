"""The estimator's recommendation from its schedules and their uncertainty bands (torch-free).

"use" only where the whole band of the best schedule is a speedup; where the band includes a slowdown the
recommendation is "measure first" (or "gain likely negligible" for a small predicted gain) and
``measure_next`` says what to measure. Delayed wgrad is described by what it moves and what it costs.
"""

from __future__ import annotations

from moe_overlap.skill.estimate.costs import DELAYED_WGRAD_COST, memory_note
from moe_overlap.skill.estimate.host import HOST_FACTORS
from moe_overlap.skill.estimate.model import (
    EstimateRequest,
    EstimateResult,
    PerLayer,
    ResolvedHardware,
    ScheduleEstimate,
)
from moe_overlap.skill.estimate.text import assumptions
from moe_overlap.skill.estimate.timeline import NodeTimes

NEGLIGIBLE_SPEEDUP = 1.05  # below a 5% predicted gain the card's "gain likely negligible" applies
SLOWER = 0.97  # predicted more than 3% slower: avoid
MEASURE = [
    "moe-overlap verify CONFIG: baseline vs overlap vs overlap + delayed wgrad on your GPUs, their steps "
    "interleaved (two separate jobs of one configuration can differ by more than a few percent: card "
    "known_limitations), judged by the skill's success criteria (throughput, loss, memory)",
    "a profile of one step without overlap (nsys): the share of step time where an all-to-all runs and no "
    "compute does; the overlap can hide at most that share, and costs host work and SMs beside it",
]
# Our layer's chunked schedule against the plain layer (fastest `none` of the same run over both transports),
# every committed two-H200 run (benchmarks/results/h200x2_2026-11-29_r3..r5): NVLink 0.39-0.99x, the emulated
# network link 1.10-1.22x. Its costs (smaller GEMMs, a gather, host work per chunk) are not modelled well enough
# to predict that: no chunked row is shown.
CHUNKED_NOTE = ("the in-layer chunked schedule is not predicted: our layer's chunked runs measured 0.39-0.99x of "
                "the plain layer over NVLink and 1.10-1.22x over an emulated network link (two H200s, "
                "benchmarks/results/h200x2_2026-11-29_r3..r5); measure it (moe-overlap verify --schedule chunked)")


def _wgrad_reason(req: EstimateRequest, nodes: NodeTimes, plain: ScheduleEstimate, wgrad: ScheduleEstimate) -> str:
    moved = (nodes.wgrad_b + nodes.wgrad_fixed) * req.layers * max(0, req.micro_batches - 1)
    delta = plain.step_ms - wgrad.step_ms
    f = HOST_FACTORS[req.a2a_engine]
    host = f"host factor x{f['1f1b+wgrad']:g} instead of x{f['1f1b']:g} (the stored closures)"
    if req.micro_batches < 2:
        return "delayed wgrad: nothing moves with one micro-batch"
    if abs(delta) <= 1e-9 * max(1.0, plain.step_ms):
        return (f"delayed wgrad moves nothing on this step's critical path: its {moved:.1f} ms of expert wgrad per "
                "step would run beside the backward dispatch, but the comm stream sets the pace either way and its "
                f"{host} stays under the GPU time; it costs memory (the wgrad's inputs live longer)")
    verb = "saves" if delta > 0 else "costs"
    return (f"delayed wgrad moves the critical path: {moved:.1f} ms of expert wgrad per step run beside the backward "
            f"dispatch; it {verb} {abs(delta):.1f} ms ({wgrad.speedup / plain.speedup - 1:+.1%} against 1f1b), "
            f"with its {host} and its GPU cost (the late pass x{1 + DELAYED_WGRAD_COST:g}: it re-reads its stored "
            "inputs beside the dispatch) counted")


def verdict(speedup: float, speedup_low: float) -> str:
    """The recommendation for a schedule's predicted speedup and the low end of its band (EP > 1, an overlap
    schedule available): "use" only when the whole band is a speedup."""
    if speedup < SLOWER:
        return "avoid"
    if speedup < NEGLIGIBLE_SPEEDUP:
        return "gain likely negligible"
    return "measure first" if speedup_low < 1.0 else "use"


def recommend(req: EstimateRequest, h: ResolvedHardware, p: PerLayer, scheds: list[ScheduleEstimate],
              nodes: NodeTimes, host_note: str | None = None) -> EstimateResult:
    none = scheds[0]
    comm_share = none.comm_ms / none.step_ms if none.step_ms else 0.0
    megatron = [s for s in scheds if s.name.startswith("1f1b") and s.available]
    candidates = megatron or [none]
    # Candidates are in order of simplicity: a more involved schedule must win by more than 0.1%.
    top = max(s.speedup for s in candidates)
    best = next(s for s in candidates if s.speedup >= top * (1 - 1e-3))
    reasons = [f"all-to-all is {comm_share:.0%} of the step without overlap "
               f"({p.a2a_ms + p.a2a_latency_ms:.3f} ms per all-to-all, 4 per layer and micro-batch)"]
    if host_note:
        reasons.append(host_note)
    band = f"{best.speedup_low:.2f}-{best.speedup_high:.2f}x"
    decision = "avoid" if req.ep == 1 or not megatron else verdict(best.speedup, best.speedup_low)
    if req.ep == 1:
        reasons.append("EP 1 has no all-to-all to hide (rule ep-size-gt-1)")
    elif not megatron:
        pass
    elif decision == "avoid":
        reasons.append(f"the best schedule ({best.name}) is predicted slower ({best.speedup:.3f}x, band {band}): "
                       "what the overlap costs (host work of the interleaved schedule, SMs the all-to-all takes "
                       "from the GEMMs) exceeds the communication it hides")
    elif decision == "gain likely negligible":
        reasons.append(f"best predicted speedup {best.speedup:.3f}x ({best.name}, band {band}) is below "
                       f"{NEGLIGIBLE_SPEEDUP:.2f}x: the run is light on communication or compute-bound")
    elif decision == "measure first":
        reasons.append(f"predicted {best.speedup:.2f}x with {best.name}, but the band of the model's own "
                       f"parameters ({band}) includes a slowdown")
    else:
        reasons.append(f"predicted speedup {best.speedup:.2f}x with {best.name} (band {band})")
    if req.micro_batches < 2:
        reasons.append("one micro-batch: Megatron-Core's overlap (1f1b) has no second micro-batch to pair "
                       "with (warning single-micro-batch); use 2 or more micro-batches (global batch / "
                       "(micro-batch size x DP))")
    if len(scheds) > 2:
        reasons.append(_wgrad_reason(req, nodes, scheds[1], scheds[2]))
    reasons.append(CHUNKED_NOTE)
    if h.overlap_efficiency >= 1.0 and h.efficiency_source.startswith("no link preset"):
        reasons.append("overlap efficiency 1.0 is an upper bound (comm kernels take SMs/cores in practice); "
                       "name the fabric, or run with calibrate for this machine's value")
    return EstimateResult(
        request=req, hardware=h, per_layer=p, schedules=scheds, comm_share=comm_share,
        recommended_schedule=best.name, predicted_speedup=best.speedup, recommendation=decision,
        reasons=reasons, assumptions=assumptions(req, h), measure_next=[] if decision == "use" else MEASURE,
        memory=memory_note(req.micro_batches, req.layers),
    )
