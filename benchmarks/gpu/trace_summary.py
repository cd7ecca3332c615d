"""Where the time goes in a torch.profiler chrome trace: streams, host gaps, blocking calls, overlap.

Pure Python over the trace JSON (no torch), so it is unit-tested on CPU with hand-made traces
(tests/unit/test_trace_summary.py) and reused by benchmarks/gpu/profile_layer.py on the GPU machine.

For every host annotation named ``<region>#<i>`` (``torch.profiler.record_function``), the window runs
from the annotation's start to the end of the last GPU op launched inside it (launches and GPU ops are
matched by their correlation id). Inside a window:

  wall_ms            window length (host start -> last GPU op end)
  streams            per CUDA stream: busy ms (union of its kernels and copies), kernel count
  compute_stream     the non-NCCL stream with the most busy time; its idle ms (gaps > 5 us) and the 5
                     longest gaps, each with the host call that was running when the gap ended (what
                     the GPU waited for)
  categories         kernel ms by kind: gemm, nccl, triton (our fused kernels), copy, other
  comm_concurrent_ms NCCL kernel time that ran while a non-NCCL kernel ran on another stream
  nccl_blocks        blocks of the widest NCCL kernel (grid size): the SMs it holds while it runs
  host               launches, blocking calls (stream/event/device synchronize, synchronous memcpy)
                     with their total ms: the host waiting for the GPU
"""

from __future__ import annotations

import gzip
import json
import re
from collections import defaultdict
from pathlib import Path

BLOCKING = ("cudaStreamSynchronize", "cudaEventSynchronize", "cudaDeviceSynchronize", "cudaMemcpy",
            "cuStreamSynchronize", "cuEventSynchronize", "cuCtxSynchronize")
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx",
            "cudaMemcpyAsync", "cudaMemsetAsync")
GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
GAP_MIN_US = 5.0


def load(path: str | Path) -> list[dict]:
    """The ``traceEvents`` of a chrome trace (.json or .json.gz)."""
    p = Path(path)
    raw = gzip.open(p, "rt").read() if p.suffix == ".gz" else p.read_text()
    doc = json.loads(raw)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def category(name: str) -> str:
    n = name.lower()
    if "nccl" in n:
        return "nccl"
    if any(k in n for k in ("gemm", "cutlass", "xmma", "nvjet", "grouped_mm", "wgmma")):
        return "gemm"
    if n.startswith("_") and "kernel" in n:  # our Triton kernels (ep/fused.py): _swiglu_fwd_kernel, ...
        return "triton"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return "other"


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def length(intervals) -> float:
    return sum(b - a for a, b in intervals)


def intersect(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """Total overlap of two unions of intervals."""
    i = j = 0
    total = 0.0
    while i < len(x) and j < len(y):
        a, b = max(x[i][0], y[j][0]), min(x[i][1], y[j][1])
        total += max(0.0, b - a)
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return total


def _region(name: str) -> str | None:
    m = re.fullmatch(r"(.+)#\d+", name)
    return m.group(1) if m else None


def summarize(events: list[dict]) -> dict[str, dict]:
    """Per region name: the metrics of the module docstring, averaged over that region's windows."""
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    marks = [e for e in spans if e.get("cat") == "user_annotation" and _region(e["name"])]
    runtime = [e for e in spans if e.get("cat") == "cuda_runtime" or e.get("cat") == "cuda_driver"]
    gpu = [e for e in spans if e.get("cat") in GPU_CATS]
    gpu_by_corr = defaultdict(list)
    for e in gpu:
        gpu_by_corr[e.get("args", {}).get("correlation")].append(e)
    per_region: dict[str, list[dict]] = defaultdict(list)
    for m in marks:
        t0, t1 = m["ts"], m["ts"] + m["dur"]
        calls = [r for r in runtime if t0 <= r["ts"] <= t1]
        ops = [g for r in calls for g in gpu_by_corr.get(r.get("args", {}).get("correlation"), [])]
        if not ops:
            continue
        per_region[_region(m["name"])].append(_window(t0, t1, calls, ops))
    return {name: _mean(ws) for name, ws in per_region.items()}


def _window(t0: float, t1: float, calls: list[dict], ops: list[dict]) -> dict:
    end = max(g["ts"] + g["dur"] for g in ops)
    by_stream: dict[int, list[dict]] = defaultdict(list)
    for g in ops:
        by_stream[g.get("args", {}).get("stream", -1)].append(g)
    streams, nccl_iv, other_iv = {}, [], []
    sid_of = {str(sid): sid for sid in by_stream}
    cats: dict[str, float] = defaultdict(float)
    for sid, evs in by_stream.items():
        iv = union([(g["ts"], g["ts"] + g["dur"]) for g in evs])
        is_nccl = any(category(g["name"]) == "nccl" for g in evs)
        streams[str(sid)] = {"busy_ms": length(iv) / 1e3, "ops": len(evs), "nccl": is_nccl}
        for g in evs:
            cat = category(g["name"]) if g.get("cat") == "kernel" else "copy"
            cats[cat] += g["dur"] / 1e3
            (nccl_iv if cat == "nccl" else other_iv).append((g["ts"], g["ts"] + g["dur"]))
    compute = max((s for s in streams if not streams[s]["nccl"]), key=lambda s: streams[s]["busy_ms"],
                  default=None)
    gaps = []
    if compute is not None:
        iv = union([(g["ts"], g["ts"] + g["dur"]) for g in by_stream[sid_of[compute]]])
        edges = [(t0, iv[0][0])] + [(iv[k][1], iv[k + 1][0]) for k in range(len(iv) - 1)]
        for a, b in edges:
            if b - a > GAP_MIN_US:
                host = [c["name"] for c in calls if c["ts"] <= b <= c["ts"] + c["dur"]]
                gaps.append({"start_us": a - t0, "ms": (b - a) / 1e3, "host_call_at_end": host[-1] if host else None})
    blocking = [c for c in calls if c["name"] in BLOCKING]
    # Blocks of the widest NCCL kernel: the SMs it holds while it runs (what a GEMM beside it cannot use;
    # moe_overlap/ep/sm_margin.py).
    grids = [g.get("args", {}).get("grid") for g in ops if category(g["name"]) == "nccl"]
    nccl_blocks = max((x[0] * x[1] * x[2] for x in grids if isinstance(x, list) and len(x) == 3), default=0)
    return {
        "wall_ms": (end - t0) / 1e3, "host_ms": (t1 - t0) / 1e3, "streams": streams, "compute_stream": compute,
        "compute_idle_ms": sum(g["ms"] for g in gaps), "compute_gaps": len(gaps),
        "top_gaps": sorted(gaps, key=lambda g: -g["ms"])[:5], "categories_ms": dict(cats),
        "comm_concurrent_ms": intersect(union(nccl_iv), union(other_iv)) / 1e3,
        "nccl_ms": length(union(nccl_iv)) / 1e3, "nccl_blocks": nccl_blocks,
        "host": {"launches": sum(1 for c in calls if c["name"] in LAUNCHES), "runtime_calls": len(calls),
                 "blocking_calls": len(blocking), "blocking_ms": sum(c["dur"] for c in blocking) / 1e3,
                 "blocking_names": sorted({c["name"] for c in blocking})},
    }


def _mean(windows: list[dict]) -> dict:
    """Numbers averaged over the windows; lists and names from the first."""
    first = dict(windows[0])

    def avg(get):
        return sum(get(w) for w in windows) / len(windows)

    for key in ("wall_ms", "host_ms", "compute_idle_ms", "compute_gaps", "comm_concurrent_ms", "nccl_ms"):
        first[key] = avg(lambda w, k=key: w[k])
    first["categories_ms"] = {c: avg(lambda w, c=c: w["categories_ms"].get(c, 0.0)) for c in first["categories_ms"]}
    first["host"] = {**first["host"], **{k: avg(lambda w, k=k: w["host"][k])
                                         for k in ("launches", "runtime_calls", "blocking_calls", "blocking_ms")}}
    first["windows"] = len(windows)
    return first


def table(summary: dict[str, dict]) -> str:
    rows = ["| region | wall ms | compute busy | compute idle ms (gaps) | gemm ms | nccl ms | nccl beside compute |"
            " launches | host blocked ms |", "|---|---|---|---|---|---|---|---|---|"]
    for name, s in summary.items():
        busy = s["streams"].get(s["compute_stream"], {}).get("busy_ms", 0.0) if s["compute_stream"] else 0.0
        rows.append(f"| {name} | {s['wall_ms']:.2f} | {busy / s['wall_ms']:.2f} | {s['compute_idle_ms']:.2f} "
                    f"({s['compute_gaps']:.0f}) | {s['categories_ms'].get('gemm', 0):.2f} | {s['nccl_ms']:.2f} | "
                    f"{s['comm_concurrent_ms']:.2f} | {s['host']['launches']:.0f} | {s['host']['blocking_ms']:.2f} |")
    return "\n".join(rows)
