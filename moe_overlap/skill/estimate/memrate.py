"""Memory-bound rates from a measurement: the estimator's memory term fed like its GEMM term (torch-free).

Reads a ``python benchmarks/gpu/gpu_layer.py --sections experts layer`` results file: our MoE layer at EP 1 on one GPU
(bf16, balanced routing), its forward + backward profiled kernel by kernel (``shapes.<name>.layer.none.
profile_fwd_bwd.top_self_gpu``), the weight-gradient accumulation timed alone (``experts.
wgrad_accumulate_one_chunk``) and a device copy (``ceilings.copy_GBps``). Each kind of memory-bound pass the
estimator models gets the share of the GPU's HBM peak it achieved, with the bytes counted as the estimator counts
them (``api._per_layer``), so that bytes / (share x another GPU's HBM peak) predicts that GPU:

* gather (permute, unpermute; 2*D elements per routed token per pass, 4 passes forward + backward): our fused
  kernels. With the routing weights in the combine (the layer before commit ca0ebb3): ``vectorized_gather_kernel``
  (permute), ``_unpermute_fwd_kernel`` x 2 (unpermute, and the permute's backward) and ``_unpermute_bwd_kernel``.
  The unpermute and the permute's backward sum a token's K rows into one (D/K written per routed row, not D) and
  the unpermute's backward reads a token's gradient once for its K rows: (6 + 3/K)*D moved where 8*D is counted,
  so the share can exceed 1 (that backward also re-reads the expert output for the routing weights' gradient,
  which the count leaves out). With the weights in the SwiGLU (ca0ebb3 on): two row gathers (permute, and the
  unpermute's backward: ``_gather_rows_kernel`` at ca0ebb3, ``index_select`` again from dfae73e) and
  ``_unpermute_fwd_kernel`` x 2; the unpermute's backward no longer reads the expert output, so the share is higher.
* activation (SwiGLU, 8*F per routed token): ``_swiglu_fwd_kernel`` + ``_swiglu_bwd_kernel`` (ours also writes
  the recomputed activation in the backward: 9*F moved), or ``_swiglu_probs_bwd_kernel`` with the weights.
* sort (sort and unsort by local expert, row copies, 2*D per pass): absent at EP 1 (one rank: nothing to regroup),
  so the device copy of the same run stands in: a copy moves exactly what the estimator counts for it.
* wgrad (``dw += dw_pass``, 3 accesses per weight): absent from the layer (its gradients are fresh every step:
  no accumulation), so the accumulation timed alone at the same shape in the same run.

Every other kernel of the layer (the GEMMs, the router, the permutation plan, casts) is no memory-bound pass the
estimator models; their time is reported (``other_ms``), never folded into a share.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from moe_overlap.skill.estimate import hardware as hw
from moe_overlap.skill.estimate.model import MemoryEfficiency

BYTES = 2  # gpu_layer.py runs the layer and the accumulation in bf16 (benchmarks/gpu/gpu_sections.py)
# For each version of our EP-1 layer's memory-bound kernels (moe_overlap/ep/fused.py, torch's index_select): the
# kernel name prefixes that do one job -> (kind, calls per forward + backward). The row gathers of the
# weights-in-the-SwiGLU layer were a Triton kernel at ca0ebb3 (`_gather_rows_kernel`), index_select again from
# dfae73e; an autotuned Triton kernel (`_gather_rows_body`, 8a145a9, reverted in 09a51a5) in the profiles of its
# experiment (h200x2_2026-11-29_r4/call6_gpu_layer_triton_gather_*).
_INDEX_SELECT = "void at::native::vectorized_gather_kernel"
LAYOUTS = (
    ("routing weights in the combine", {
        (_INDEX_SELECT,): ("gather", 1), ("_unpermute_fwd_kernel",): ("gather", 2),
        ("_unpermute_bwd_kernel",): ("gather", 1), ("_swiglu_fwd_kernel",): ("activation", 1),
        ("_swiglu_bwd_kernel",): ("activation", 1)}),
    ("routing weights in the SwiGLU", {
        (_INDEX_SELECT, "_gather_rows_"): ("gather", 2), ("_unpermute_fwd_kernel",): ("gather", 2),
        ("_swiglu_fwd_kernel",): ("activation", 1), ("_swiglu_probs_bwd_kernel",): ("activation", 1)}),
)
GEMM_MARKS = ("cutlass", "gemm", "nvjet")


class MemRateError(ValueError):
    """The file cannot give the rates: says which file, what is missing and how to get it."""

    field = "mem_rate"
    fix = ("give the --out file of `python benchmarks/gpu/gpu_layer.py --sections experts layer` (one GPU, fused "
           "kernels on), measured at this shape, or give one share for every pass (hbm_efficiency, --hbm-efficiency)")


@dataclass(frozen=True)
class MemRate:
    """The shares, and what they were computed from (for the table and the docs)."""

    efficiency: MemoryEfficiency
    gpu: str
    hbm_gbps: float
    shape: str
    routed: int
    kernel_ms: dict[str, float]  # gather, activation, gemm, other (the rest of the profiled kernel time)
    model_bytes: dict[str, float]  # gather, activation, sort (per GB/s of the copy), wgrad
    gbps: dict[str, float]  # achieved, bytes as counted


def _shape(data: dict, label: str, hidden: int | None, moe_ffn: int | None) -> tuple[str, dict]:
    shapes = data.get("shapes") if isinstance(data, dict) else None
    if not isinstance(shapes, dict) or not shapes:
        raise MemRateError(f"{label}: no shapes (not a gpu_layer.py results file)")
    if hidden is None and moe_ffn is None and len(shapes) == 1:
        return next(iter(shapes.items()))
    hit = [(k, v) for k, v in shapes.items() if isinstance(v, dict) and isinstance(v.get("shape"), dict)
           and (v["shape"].get("hidden"), v["shape"].get("ffn")) == (hidden, moe_ffn)]
    if not hit:
        have = ", ".join(f"{k} (hidden {v.get('shape', {}).get('hidden')}, ffn {v.get('shape', {}).get('ffn')})"
                         for k, v in shapes.items() if isinstance(v, dict))
        raise MemRateError(f"{label}: no shape with hidden {hidden} and ffn {moe_ffn} (measured: {have})")
    return hit[0]


def _kernel_ms(kernels: list[tuple[str, int, float]], where: str) -> tuple[dict[str, float], str]:
    """ms per kind (gather, activation, gemm) of the profile, by the layout whose kernels it holds exactly."""
    misses = []
    for layout, jobs in LAYOUTS:
        ms = {"gather": 0.0, "activation": 0.0, "gemm": 0.0}
        calls: dict[tuple[str, ...], int] = {}
        for key, n, t in kernels:
            job = next((j for j in jobs if key.startswith(j)), None)
            if job is not None:
                ms[jobs[job][0]] += t
                calls[job] = calls.get(job, 0) + n
            elif any(m in key.lower() for m in GEMM_MARKS):
                ms["gemm"] += t
        missing = [f"{' or '.join(j)} x{c} (found {calls.get(j, 0)})" for j, (_, c) in jobs.items()
                   if calls.get(j, 0) != c]
        if not missing:
            return ms, layout
        misses.append(f"{layout}: " + ", ".join(missing))
    raise MemRateError(f"{where}: the profile does not hold the fused EP-1 layer's memory-bound kernels ("
                       + "; ".join(misses) + ")")


def from_layer_results(data: dict, label: str, *, hidden: int | None = None, moe_ffn: int | None = None
                       ) -> MemRate:
    """The shares of the shape with this hidden and FFN size (the only shape when both are None)."""
    name, entry = _shape(data, label, hidden, moe_ffn)
    where = f"{label}: shapes.{name}"
    try:
        shape = entry["shape"]
        d, f, routed = int(shape["hidden"]), int(shape["ffn"]), int(shape["tokens"]) * int(shape["topk"])
        prof = entry["layer"]["none"]["profile_fwd_bwd"]
        total, top = float(prof["gpu_kernel_ms"]), prof["top_self_gpu"]
        acc = entry["experts"]["wgrad_accumulate_one_chunk"]
        acc_ms, acc_bytes = float(acc["median_ms"]), float(acc["bytes"])
        copy_gbps = float(data["ceilings"]["copy_GBps"])
        gpu_name = str(data["machine"]["gpu"])
        kernels = [(str(k), int(n), float(ms)) for k, n, ms in top]
    except (KeyError, TypeError, ValueError) as exc:
        raise MemRateError(f"{where}: missing or malformed {exc} (layer.none.profile_fwd_bwd, "
                           "experts.wgrad_accumulate_one_chunk, ceilings.copy_GBps, machine.gpu)") from None
    gpu = hw.gpu_for_device(gpu_name)
    if gpu is None or not gpu.hbm_gbps:
        raise MemRateError(f"{label}: measured on {gpu_name!r}, whose HBM peak no GPU preset knows "
                           f"({', '.join(sorted(hw.GPUS))})")
    ms, layout = _kernel_ms(kernels, where)
    ms["other"] = max(0.0, total - ms["gather"] - ms["activation"] - ms["gemm"])
    counted = {"gather": 4 * 2 * d * routed * BYTES, "activation": 8 * f * routed * BYTES, "wgrad": acc_bytes}
    gbps = {"gather": counted["gather"] / ms["gather"] / 1e6, "activation": counted["activation"] /
            ms["activation"] / 1e6, "sort": copy_gbps, "wgrad": acc_bytes / acc_ms / 1e6}
    if min(gbps.values()) <= 0:
        raise MemRateError(f"{where}: a kernel time or rate is zero")
    peak = gpu.hbm_gbps
    shares = {k: v / peak for k, v in gbps.items()}
    too_high = {k: round(v, 3) for k, v in shares.items() if v > 2.0}
    if too_high:
        raise MemRateError(f"{where}: shares of {peak:g} GB/s above 2 are not a memory-bound rate: {too_high}")
    src = (f"{label}, shapes.{name} ({d}/{f}, {routed} routed rows, {layout}) on one {gpu_name} ({peak:g} GB/s HBM): "
           f"gathers {counted['gather'] / 1e9:.3f} GB as counted in {ms['gather']:.3f} ms, SwiGLU "
           f"{counted['activation'] / 1e9:.3f} GB in {ms['activation']:.3f} ms (layer.none.profile_fwd_bwd); sort = "
           f"device copy {copy_gbps:g} GB/s (ceilings.copy_GBps); wgrad = experts.wgrad_accumulate_one_chunk; "
           f"in no memory term: GEMMs {ms['gemm']:.3f} ms and other kernels (router, permutation plan, casts) "
           f"{ms['other']:.3f} ms of the layer's {total:.3f}")
    return MemRate(efficiency=MemoryEfficiency(**shares, source=src), gpu=gpu_name, hbm_gbps=peak, shape=name,
                   routed=routed, kernel_ms=ms, model_bytes=counted, gbps=gbps)


def load(path: str | Path, *, hidden: int | None = None, moe_ffn: int | None = None,
         label: str | None = None) -> MemRate:
    """:func:`from_layer_results` of a file; ``label`` names it in the source (default: the path as given)."""
    label = label or str(path)
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise MemRateError(f"{label}: not a readable JSON file ({exc})") from None
    return from_layer_results(data, label, hidden=hidden, moe_ffn=moe_ffn)
