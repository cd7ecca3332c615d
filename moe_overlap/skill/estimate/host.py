"""The host-bound floor of the estimator: no schedule finishes a layer before the host has issued it (torch-free).

A PyTorch MoE layer is a few hundred host operations per forward + backward (kernel launches, collectives,
small bookkeeping; about 370 in ours at EP 2, docs/benchmarks.md "Where the time goes at EP 2"). When the
GPU work is short (small experts, fast links) the host issuing them sets the pace and the compute stream idles
between kernels: overlapping the all-to-alls with compute on the GPU cannot shorten a step the host has not
finished issuing. So each schedule's step is max(its two-stream GPU timeline, its host time), and a layer
whose host time is at or above every GPU timeline is "host-bound: overlap cannot help".

Host time of a schedule, per layer and micro-batch = ``host_ms`` (the no-overlap layer's forward + backward
issue time: a calibration input, measured on the machine and implementation at hand) x the schedule's factor:

* ``none``: 1.
* ``1f1b`` / ``1f1b+wgrad``: a layer pair issues the ops of one forward and one backward, plus the pairing's
  bookkeeping (events, stream switches, the deferred wgrad's closures). Factors: the pair row's ``host_ms`` over
  the no-overlap row's, mean over the three shapes of the two-H200 runs in FACTOR_FILES
  (``benchmarks/gpu/ep_overlap.py``'s host issue time per call, median, no profiler), one pair of factors per
  all-to-all engine. They differ by engine because the no-overlap layer's host time does: over copy engines the
  plain layer already issues the per-peer copies and the events that order them (its ``host_ms`` is 0.2-0.7 ms
  above NCCL's in the same calls), which the interleaved pair does not add again; an SM-driven all-to-all (NCCL,
  DeepEP, HybridEP) is one launch, so the pairing's bookkeeping is the whole excess. Every copy-engine factor
  of the three files is below every NCCL one at the same shape.
* ``chunked`` with C chunks: 1 + CHUNK_HOST_SHARE x (C - 1): each extra chunk re-issues the expert and
  all-to-all part of the layer. The share is the median of (host chunked:C / host none - 1) / (C - 1) over the
  same rows, C = 2 and 4.

Without ``host_ms`` (no request value, no calibration value) there is no floor: host cost depends on the
implementation and the CPU, and a default measured on ours would be wrong for Megatron-Core on another host.
"""

from __future__ import annotations

_R3 = "benchmarks/results/h200x2_2026-11-29_r3/ep_overlap_cuda_r2"
# the runs each engine's factors are the mean of (NCCL twice, copy engines once): recomputed by a unit test
ENGINE_FILES = {"sm": (f"{_R3}.json", f"{_R3}_repeat.json"), "copy-engine": (f"{_R3}_ce.json",)}
FACTOR_FILES = tuple(f for files in ENGINE_FILES.values() for f in files)
HOST_FACTORS = {"sm": {"none": 1.0, "1f1b": 1.177, "1f1b+wgrad": 1.214},
                "copy-engine": {"none": 1.0, "1f1b": 1.109, "1f1b+wgrad": 1.112}}
CHUNK_HOST_SHARE = 0.54  # recomputed from FACTOR_FILES by a unit test
HOST_BOUND_SHARE = 0.95  # host time >= 95% of the no-overlap GPU timeline: the host sets the pace


def host_factor(schedule: str, chunks: int = 1, excess: float = 1.0, engine: str = "sm") -> float:
    """Host time of one layer (pair) in `schedule` over the no-overlap layer's host time, with the all-to-all
    moved by `engine` ("sm" or "copy-engine"); `excess` scales the part above 1 (the uncertainty band)."""
    if schedule == "chunked":
        return 1.0 + CHUNK_HOST_SHARE * (chunks - 1) * excess
    return 1.0 + (HOST_FACTORS[engine][schedule] - 1.0) * excess


def floor_ms(gpu_ms: float, host_ms_per_layer: float | None, schedule: str, layer_steps: int,
             chunks: int = 1, excess: float = 1.0, engine: str = "sm") -> tuple[float, bool]:
    """(step ms of the layers, host-bound?): the GPU timeline or, when larger, the schedule's host time over
    `layer_steps` = layers x micro-batches."""
    if not host_ms_per_layer:
        return gpu_ms, False
    host = host_ms_per_layer * host_factor(schedule, chunks, excess, engine) * layer_steps
    return (host, True) if host > gpu_ms else (gpu_ms, False)


def host_bound_note(host_ms_per_layer: float, gpu_none_ms_per_layer: float, engine: str = "sm") -> str | None:
    """The reason to print when the no-overlap layer is host-bound, else None."""
    if gpu_none_ms_per_layer <= 0 or host_ms_per_layer < HOST_BOUND_SHARE * gpu_none_ms_per_layer:
        return None
    return (f"host-bound: overlap cannot help. The host takes {host_ms_per_layer:.3f} ms to issue one layer's "
            f"forward + backward, {host_ms_per_layer / gpu_none_ms_per_layer:.0%} of its "
            f"{gpu_none_ms_per_layer:.3f} ms of GPU work without overlap; overlapping streams shortens the GPU "
            "timeline, not the host's, and every overlap schedule issues more host work (1f1b "
            f"x{HOST_FACTORS[engine]['1f1b']:.3f}, chunked +{CHUNK_HOST_SHARE:.0%} per extra chunk). Cut host work "
            "first (CUDA graphs, fewer small ops, larger micro-batches)")
