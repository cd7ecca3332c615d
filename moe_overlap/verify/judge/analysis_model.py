"""What a verification report explains: where each mode's step time goes, what the estimator predicted, and
why overlap paid or did not (pydantic models, torch-free; built by verify/judge/explain.py).

Definitions (docs/verify.md, "Where the time goes"), all per optimizer step, times in seconds:
  comm             the step's all-to-alls and count exchanges timed alone in the same ranks (verify/calibrate/pieces.py)
  compute          baseline step - comm: the baseline runs its all-to-alls on the compute stream, one after the
                   other, so everything else it does is compute; every mode does the same compute
  exposed comm     step - compute (at least 0): the communication the mode did not hide
  hidden comm      comm - exposed comm (at least 0)
  overlap efficiency  (compute + comm - step) / min(compute, comm), capped at 1: the share of the
                   communication hidden; 1 = the ideal two-stream step, 0 = the serial step, below 0 = slower
                   than doing everything one after the other
  gain beyond comm (baseline step - step) - min(compute, comm) when positive: the step got shorter by more
                   than hiding all of the communication could give, so the rest came from host work the
                   overlapped order filled (or noise); None otherwise
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


def hidden_share(step: float | None, compute: float | None, comm: float | None
                 ) -> tuple[float | None, float | None]:
    """(overlap efficiency, gain beyond the communication) of one mode's step (the module docstring).

    The efficiency is the share of min(compute, comm) the mode hid, capped at 1: a step shorter than the
    baseline by more than that saved host work the overlapped order filled (or noise), not hidden
    communication, and that excess is the second value (None when the gain is within the communication)."""
    if step is None or compute is None or comm is None:
        return None, None
    shorter = min(compute, comm)
    if shorter <= 0:
        return None, None
    gain = compute + comm - step  # = baseline step - step
    beyond = gain - shorter
    # 1 ns: below any timer's resolution, so float rounding of an exact fit is not reported as a gain
    return round(min(1.0, gain / shorter), 3), (beyond if beyond > 1e-9 else None)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OverlapProbe(_Model):
    """One dispatch all-to-all alone, one expert forward alone, and both at once (summed over one step)."""

    a2a_s: float = Field(ge=0)
    experts_s: float = Field(ge=0)
    both_s: float = Field(ge=0)
    overlap_efficiency: float | None = Field(description="(a2a + experts - both) / min(a2a, experts); None at EP 1")


class StepPieces(_Model):
    """One step's pieces timed alone in the ranks after training (slowest rank, median over rounds)."""

    comm_s: float = Field(ge=0, description="all-to-alls + count exchanges of one step")
    a2a_s: float = Field(ge=0, description="dispatch, combine and their backward twins, every layer and micro-batch")
    count_exchange_s: float = Field(ge=0)
    experts_s: float = Field(ge=0, description="expert forward + dgrad + wgrad GEMMs of one step")
    experts_fwd_s: float = Field(ge=0)
    experts_dgrad_s: float = Field(ge=0)
    experts_wgrad_s: float = Field(ge=0)
    probe: OverlapProbe
    a2a_bytes_off_rank: int = Field(ge=0, description="bytes one rank sends to other ranks in one step (busiest rank)")
    rows_received: int = Field(ge=0, description="routed rows the busiest rank's experts process per step (forward)")
    expert_flops: int = Field(ge=0, description="expert GEMM FLOPs of one step (forward + dgrad + wgrad)")
    a2a_calls: int = Field(ge=0)
    count_exchanges: int = Field(ge=0)
    rounds: int = Field(ge=1)
    layers: int = Field(ge=1)
    micro_batches: int = Field(ge=1)
    model_of: str | None = Field(None, description="the mode whose trained model was replayed")
    layer_s: float | None = Field(None, ge=0, description="every layer's forward + backward without overlap, one "
                                  "at a time, summed over one step; None: a run before this was recorded")
    layer_host_s: float | None = Field(None, ge=0, description="the host issue time of those calls (queued, "
                                       "before the closing device sync); on CPU equal to layer_s")
    host_ms_per_layer: float | None = Field(None, ge=0, description="layer_host_s per layer and micro-batch, ms: "
                                            "the estimator's host_ms (used for its host floor on CUDA only)")


class ModeBreakdown(_Model):
    """One mode's step time split (see the module docstring); None where it cannot be derived."""

    mode: str
    step_s: float | None = Field(description="median step time after the warm-up step")
    tokens_per_s: float | None = None
    measured_ratio: float | None = Field(None, description="tokens/s over the baseline (paired median)")
    compute_s: float | None = None
    comm_s: float | None = None
    exposed_comm_s: float | None = None
    hidden_comm_s: float | None = None
    overlap_efficiency: float | None = Field(None, description="(compute + comm - step) / min(compute, comm), "
                                             "capped at 1: the share of the communication hidden (1 = all of "
                                             "it, below 0 = slower than serial); None without pieces")
    gain_beyond_comm_s: float | None = Field(None, ge=0, description="(baseline step - step) - min(compute, comm) "
                                             "when positive: the step got shorter by more than hiding all the "
                                             "communication could give (host work the overlapped order filled, "
                                             "or noise); None when the gain is within it")
    optimizer_s: float | None = Field(None, description="the optimizer update alone (median)")
    host_issue_s: float | None = Field(None, description="host issue time of the step's forward + backward "
                                       "(median, slowest rank): until the host had queued its last work, the "
                                       "optimizer excluded; includes the host's waits at the count exchanges")
    peak_memory_bytes: int | None = Field(None, description="median over steps of the per-step peak (see StepRecord)")
    predicted_ratio: float | None = Field(None, description="the estimator's tokens/s over the baseline")
    prediction_error: float | None = Field(None, description="predicted / measured - 1")


class Prediction(_Model):
    """The estimator (skill/estimate) for this config and machine, beside the measured ratios."""

    available: bool
    reason: str = Field(description="what fed the estimator, or why there is no prediction")
    overlap_efficiency: float | None = None
    efficiency_source: str | None = None
    request: dict[str, Any] | None = Field(None, description="the EstimateRequest, calibration included")
    step_s: dict[str, float] = Field(default_factory=dict, description="predicted step time per estimator schedule")
    host_ms: float | None = Field(None, description="host issue time per layer and micro-batch fed to the "
                                  "estimator's host floor (CUDA runs with the layers' host time measured)")
    host_bound: list[str] = Field(default_factory=list, description="estimator schedules whose predicted step is "
                                  "the host's issue time, not the GPU timeline")
    host_note: str | None = Field(None, description="why the floor applies or not (the estimator's wording when "
                                  "the layer is host-bound)")


class Explanation(_Model):
    """Why overlap paid or did not, from the measurement, and what would change it."""

    pays: bool | None = Field(description="whether some overlap mode measured faster than the baseline "
                                           "(outside its band); None without a comparison")
    cause: str = Field(description="the measured cause, in one sentence")
    what_would_change_it: list[str] = Field(default_factory=list)
    comm_share: float | None = Field(None, description="comm / baseline step")
    ceiling_ratio: float | None = Field(None, description="baseline step / (baseline step - min(comm, compute)): the "
                                                          "best tokens/s ratio any overlap could reach")


class Analysis(_Model):
    """report.json's `analysis`: the pieces, the per-mode split, the prediction, the explanation."""

    available: bool
    reason: str | None = Field(None, description="why the split is missing (no pieces record, no baseline)")
    pieces: StepPieces | None = None
    modes: list[ModeBreakdown] = Field(default_factory=list)
    prediction: Prediction
    explanation: Explanation | None = None
