#!/usr/bin/env python3
"""Grouped expert GEMM rate (raw ``torch._grouped_mm``, forward + backward) at named per-rank shapes.

    python benchmarks/gpu/gemm_rate.py --device cuda --out $OUT/gemm_rate.json     # on the lent GPU (one call)
    python benchmarks/gpu/gemm_rate.py --device cpu                                # tiny shapes, seconds
    python benchmarks/gpu/gemm_rate.py --device cuda --sm-margins 2 8 16 32       # also under each SM carve-out

What one iteration runs: the six grouped GEMMs of an expert forward + backward, exactly as
benchmarks/gpu/gpu_layer.py's raw-GEMM section (``gpu_sections.expert_gemms``): forward x@w1 [S, 2F] and
a@w2 [S, D], dgrad dy@w2^T and dh@w1^T, wgrad x^T dh and a^T dy; 18*S*D*F flops, bf16, balanced
groups (every local expert gets S/L rows), offsets built once. No SwiGLU, no autograd, no host sync.
Timing on CUDA: common/timing.py's cuda_time (warm-up, then CUDA events between back-to-back iterations),
median of --iters (>= 20); on CPU: wall clock per iteration, median (the loop path where the device
lacks ``torch._grouped_mm``; CPU numbers say nothing about a GPU).

``--sm-margins``: the same six GEMMs again with the expert GEMMs leaving m SMs free (``ep/sm_margin.py``'s
``gemm_sm_margin``, what a 1F1B layer pair sets around its expert nodes), one median per margin, alone on the
GPU (no all-to-all beside them): what the margin itself costs the GEMMs (the estimator's ``sm_margin`` input).

Why: the estimator (moe_overlap/skill/estimate) needs the expert GEMM rate at the shape a rank
actually runs. The DeepSeek-V3 proxy anchor (Megatron-LM moe_perf baseline, 8xH100, EP8) runs 4 local
experts x 8192 rows per rank; H100 SXM and H200 share the GPU (GH100, the same dense bf16 tensor-core peak,
989 TFLOP/s, on NVIDIA's H100 and H200 datasheets), H200 differs in HBM (141 GB, 4.8 TB/s vs 80 GB,
3.35 TB/s), and at these shapes the GEMMs are compute-bound, so an H200 measurement at the anchor's per-rank
shape calibrates its GEMM term. The JSON also carries the dense 8192^3 matmul rate and copy bandwidth of the
same run and the GPU's SM count.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and moe_overlap from this checkout, however started

import torch  # noqa: E402

from benchmarks.common.timing import ceilings, cuda_time  # noqa: E402
from benchmarks.gpu.ep_overlap import machine_info  # noqa: E402
from benchmarks.gpu.gpu_sections import expert_gemms  # noqa: E402

# Per-rank shapes: L local experts x R rows each (balanced top-k routing of 4096 tokens x top-8 over
# E experts at EP N gives L = E/N and R = 4096*8/L), hidden D, expert FFN F (public config.json files).
SHAPES = {
    "dsv3-proxy-ep8": dict(experts=4, rows=8192, hidden=7168, ffn=2048,
                           about="Megatron-LM moe_perf DeepSeek-V3 proxy anchor per rank (32 experts, EP8)"),
    "dsv3-proxy-ep2": dict(experts=16, rows=2048, hidden=7168, ffn=2048,
                           about="our dsv3-proxy preset at EP 2 (benchmarks/gpu/ep_overlap.py)"),
    "qwen3-ep16": dict(experts=8, rows=4096, hidden=2048, ffn=768,
                       about="Qwen3-30B-A3B, 128 experts at EP16 (Megatron-Bridge anchor)"),
    "qwen3-ep2": dict(experts=64, rows=512, hidden=2048, ffn=768,
                      about="our qwen3-30b-a3b preset at EP 2"),
    "deepseek-v3-ep2": dict(experts=128, rows=256, hidden=7168, ffn=2048,
                            about="our deepseek-v3 preset at EP 2 (256 experts)"),
    "balanced-ffn30080-ep2": dict(experts=8, rows=2048, hidden=2048, ffn=30080,
                                  about="ep_overlap.py --preset balanced --ffn 30080 at EP 2 (emulated-link runs)"),
    "balanced-ffn14208-ep2": dict(experts=8, rows=2048, hidden=2048, ffn=14208,
                                  about="ep_overlap.py --preset balanced --ffn 14208 at EP 2 (emulated-link runs)"),
}
CPU_SHAPES = {
    "tiny-a": dict(experts=4, rows=32, hidden=64, ffn=32, about="CPU smoke shape"),
    "tiny-b": dict(experts=2, rows=16, hidden=32, ffn=16, about="CPU smoke shape"),
}
MIN_ITERS = 20


def flops(shape: dict) -> float:
    return 18.0 * shape["experts"] * shape["rows"] * shape["hidden"] * shape["ffn"]


def _cpu_time(fn, warmup: int, iters: int) -> dict:
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "iters": iters}


def gemms_fn(shape: dict, device: str, dtype=torch.bfloat16):
    """(a call running the six GEMMs of `shape` once on fixed random inputs, the path it takes)."""
    from moe_overlap.ep.experts import grouped_mm_supported

    L, R, D, F = shape["experts"], shape["rows"], shape["hidden"], shape["ffn"]
    S = L * R
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*size, scale=1.0):
        return torch.randn(*size, device=device, dtype=dtype, generator=gen) * scale

    x, a, dy, dh = rand(S, D), rand(S, F), rand(S, D), rand(S, 2 * F)
    w1, w2 = rand(L, D, 2 * F, scale=D**-0.5), rand(L, F, D, scale=F**-0.5)
    counts = (R,) * L
    offs = torch.tensor(list(itertools.accumulate(counts)), dtype=torch.int32, device=device)
    path = "grouped_mm" if grouped_mm_supported(torch.device(device).type, dtype) else "loop"

    def fn():
        expert_gemms(x, a, dy, dh, w1, w2, offs, counts, path)  # results dropped: each call allocates anew

    return fn, path


def measure(shape: dict, device: str, iters: int, warmup: int, dtype=torch.bfloat16,
            margins: tuple[int, ...] = ()) -> dict:
    """One shape: median ms of the six GEMMs and the rate in TFLOP/s; with `margins`, the median under each SM
    carve-out too (`sm_margin`: {m: {median_ms, slowdown}}, slowdown = that median over the plain one)."""
    fn, path = gemms_fn(shape, device, dtype)
    S = shape["experts"] * shape["rows"]

    def timed():
        return cuda_time(fn, warmup=warmup, iters=iters) if device == "cuda" else _cpu_time(fn, warmup, iters)

    t = timed()
    out = {"shape": shape, "rows_total": S, "flops": flops(shape), "path": path, "dtype": str(dtype),
           "median_ms": round(t["median_ms"], 4), "min_ms": round(t["min_ms"], 4), "iters": t["iters"],
           "tflops": float(f"{flops(shape) / (t['median_ms'] * 1e-3) / 1e12:.4g}")}
    if margins:
        from moe_overlap.ep.sm_margin import available, gemm_sm_margin

        out["sm_margin"] = {}
        for m in margins:
            with gemm_sm_margin(m, torch.device(device)):
                tm = timed()
            out["sm_margin"][str(m)] = {"median_ms": round(tm["median_ms"], 4),
                                        "slowdown": round(tm["median_ms"] / t["median_ms"], 4)}
        out["sm_margin_applied"] = device == "cuda" and available()  # elsewhere gemm_sm_margin changes nothing
        # the plain GEMMs once more after the margins: how far two medians of the same thing differ here
        out["median_ms_repeat"] = round(timed()["median_ms"], 4)
    return out


def markdown(res: dict) -> str:
    lines = ["| shape | local experts x rows | D | F | path | median ms | min ms | TFLOP/s |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in res["shapes"].items():
        s = r["shape"]
        lines.append(f"| {name} | {s['experts']} x {s['rows']} | {s['hidden']} | {s['ffn']} | {r['path']} | "
                     f"{r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['tflops']:.4g} |")
        if r.get("sm_margin"):
            lines.append("|  SM margin slowdown: " + ", ".join(f"{m}: x{v['slowdown']:.3f}" for m, v in
                                                                 r["sm_margin"].items()) + " | | | | | | | |")
    dense = res.get("ceilings")
    if dense:
        lines += ["", f"dense bf16 matmul 8192^3, same run: {dense['matmul_bf16_tflops']} TFLOP/s; copy {dense['copy_GBps']} GB/s"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--shapes", nargs="+", default=None,
                    help=f"names (default: all of the device's; cuda: {', '.join(SHAPES)}; cpu: {', '.join(CPU_SHAPES)})")
    ap.add_argument("--iters", type=int, default=MIN_ITERS, help=f"timed iterations, median (>= {MIN_ITERS})")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--sm-margins", type=int, nargs="*", default=[],
                    help="also time the GEMMs leaving each of these SM counts free (ep/sm_margin.py)")
    a = ap.parse_args(argv)
    table = SHAPES if a.device == "cuda" else {**CPU_SHAPES, **SHAPES}
    names = a.shapes or list(SHAPES if a.device == "cuda" else CPU_SHAPES)
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"error: --shapes: unknown {', '.join(unknown)}; choose from {', '.join(table)}", file=sys.stderr)
        return 2
    if a.iters < MIN_ITERS:
        print(f"error: --iters {a.iters}: a median needs at least {MIN_ITERS}; raise --iters", file=sys.stderr)
        return 2
    if any(m <= 0 for m in a.sm_margins):
        print("error: --sm-margins: each margin must be an int > 0 (0 is the plain row)", file=sys.stderr)
        return 2
    if a.warmup < 0:
        print("error: --warmup must be >= 0", file=sys.stderr)
        return 2
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device here: run it on the GPU machine, or --device cpu",
              file=sys.stderr)
        return 2
    machine = machine_info(a.device)
    if a.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        machine.update(gpu=torch.cuda.get_device_name(), sm_count=props.multi_processor_count,
                       memory_bytes=props.total_memory)
    res = {"command": "python " + " ".join(["benchmarks/gpu/gemm_rate.py", *(argv if argv is not None else sys.argv[1:])]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": machine, "device": a.device,
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
           "timing": ("CUDA events between back-to-back iterations after warm-up, median" if a.device == "cuda"
                      else "wall clock per iteration after warm-up, median"),
           "flops_per_iter": "18 * local experts * rows * D * F (fwd x@w1, a@w2; dgrad; wgrad)", "shapes": {}}
    if a.device == "cuda":
        res["ceilings"] = ceilings()
    for name in names:
        res["shapes"][name] = measure(table[name], a.device, a.iters, a.warmup, margins=tuple(a.sm_margins))
        if a.device == "cuda":
            torch.cuda.empty_cache()
        print(f"[{name}] {res['shapes'][name]['tflops']} TFLOP/s", file=sys.stderr, flush=True)
    print(markdown(res))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
