"""GPU benchmark of the expert path and the layer schedules on one GPU (EP 1, bf16, balanced routing).

    python benchmarks/gpu/gpu_layer.py --out $OUT/gpu_layer.json         # on the lent H200 (one call)

Measures, in one process, against ceilings measured in the same run:
  * ceilings: dense bf16 matmul (8192^3, random data) and device-to-device copy bandwidth
    (bytes read + bytes written);
  * experts: raw ``torch._grouped_mm`` forward+backward (the 6 grouped GEMMs, offsets built once)
    vs ``GroupedExperts`` forward+backward through autograd (GEMMs + SwiGLU + bookkeeping), TFLOP/s
    counted as 18*S*D*F; ablations: torch SwiGLU instead of the fused kernel
    (MOE_OVERLAP_FUSED=0), offsets through ``torch.tensor(list, device=cuda)`` (the old host sync);
  * permutation: permute / unpermute and their backwards, GB/s of the minimal bytes (every input
    read once, every output written once) vs the copy bandwidth; fused vs torch;
  * the whole MoELayer (1-rank NCCL group) forward and forward+backward for schedules none and
    chunked, peak memory, and the host syncs of one forward+backward (torch sync debug mode);
  * megatron-core's MoELayer (SequentialMLP, alltoall dispatcher, no Transformer Engine) where it
    runs, at the same shape.
Timing: CUDA events around each iteration, iterations queued back to back (the host runs ahead
unless the code synchronizes it, so hidden host syncs show up as time), warm-up first, median.
Shapes: Qwen3-30B-A3B experts (D 2048, F 768; its Hugging Face config.json) with 16 local experts and
DeepSeek-V3 experts (D 7168, F 2048; its config.json) with 32 local experts; 4096 tokens x top-8 = 32768 rows.

Before/after in one call: ``BENCH_CODE_ROOT=DIR`` imports ``moe_overlap`` from DIR (e.g. an older commit
unpacked with ``git archive <commit> moe_overlap | tar -x -C DIR``) instead of this checkout; the JSON
records which code ran (``code_root``, ``code_commit``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and moe_overlap from this checkout, however started
# benchmarks.* is imported before BENCH_CODE_ROOT goes first on sys.path: these sections are this checkout's
# (their moe_overlap imports are inside the functions, so they measure the version asked for).
from benchmarks.common.timing import ceilings  # noqa: E402
from benchmarks.gpu.gpu_sections import (  # noqa: E402
    bench_experts,
    bench_graph,
    bench_layer,
    bench_megatron,
    bench_permute,
    bench_step,
    syncs_only,
)

CODE_ROOT = os.environ.get("BENCH_CODE_ROOT")
if CODE_ROOT:  # measure another version of moe_overlap (see the module docstring)
    sys.path.insert(0, str(Path(CODE_ROOT).resolve()))

SECTIONS = ["experts", "permute", "layer", "graph", "megatron", "step"]
SHAPES = {
    "qwen3-30b-a3b": dict(hidden=2048, ffn=768, experts=16, tokens=4096, topk=8),
    "deepseek-v3": dict(hidden=7168, ffn=2048, experts=32, tokens=4096, topk=8),
}


def guarded(results: dict, key: str, fn, *args):
    try:
        results[key] = fn(*args)
    except Exception as exc:  # one failing section must not lose the others
        results[key] = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    print(f"[{key}] done", flush=True)


def _version(dist_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist_name)
    except PackageNotFoundError:
        return None


def _print_graph(key: str, gr: dict, raw: float) -> None:
    """One line for a graph section (raw: the bare grouped GEMMs' time, what is beyond them is the rest)."""
    if "graph" not in gr:
        if gr:
            print(f"  {key} error", gr.get("error"))
        return
    eager, graph = gr["eager"], gr["graph"]
    print(f"  {key}: eager {eager['fwd_bwd_median_ms']:.3f} ms (beyond GEMMs {eager['fwd_bwd_median_ms'] - raw:.3f}, "
          f"gpu busy {eager['profile']['gpu_busy_frac']}) graphed {graph['fwd_bwd_median_ms']:.3f} ms (beyond "
          f"{graph['fwd_bwd_median_ms'] - raw:.3f}, gpu busy {graph['profile']['gpu_busy_frac']})  "
          f"bitwise {gr['bitwise_vs_eager']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_layer.json")
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--skip-megatron", action="store_true")
    ap.add_argument("--sections", nargs="+", default=SECTIONS, choices=SECTIONS)
    ap.add_argument("--step-batch", type=int, default=None, help="micro-batch size of the step (preset: 4)")
    ap.add_argument("--step-rounds", type=int, default=40)
    ap.add_argument("--syncs-only", action="store_true", help="only list the layer's host syncs (with stacks)")
    ap.add_argument("--graph-sync-free", action="store_true",
                    help="graph section: also the EP > 1 sync-free path (ep/sync_free.py) forced at world 1, "
                         "eager vs graphed (result key graph_sync_free)")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU machine", file=sys.stderr)
        return 2
    import torch.distributed as dist

    from moe_overlap.verify.run.ranks import free_port

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    res = {"command": "python " + " ".join(sys.argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"gpu": torch.cuda.get_device_name(), "platform": platform.platform(),
                       "cpu_count": os.cpu_count()},
           "versions": {"python": platform.python_version(), "torch": torch.__version__,
                        "cuda": torch.version.cuda, "triton": _version("triton"),
                        "megatron-core": _version("megatron-core")},
           "timing": "CUDA events, back-to-back iterations after warm-up, median", "shapes": {},
           "code_root": CODE_ROOT or str(ROOT), "code_commit": os.environ.get("BENCH_CODE_COMMIT", "this checkout")}
    if a.syncs_only:
        for name in a.shapes:
            guarded(res["shapes"], name, syncs_only, SHAPES[name], dist.group.WORLD)
        print(json.dumps(res["shapes"], indent=1))
        a.out.write_text(json.dumps(res, indent=2, default=str) + "\n")
        return 0
    guarded(res, "ceilings", ceilings)
    copy_gbps = res["ceilings"].get("copy_GBps", 4300.0)

    def save():
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2, default=str) + "\n")

    for name in a.shapes:
        res["shapes"][name] = {"shape": SHAPES[name]}
    if "graph" in a.sections:  # captured before any profiler has run in this process (it comes last there)
        for name in a.shapes:
            guarded(res["shapes"][name], "graph", bench_graph, SHAPES[name], dist.group.WORLD)
            torch.cuda.empty_cache()
            if a.graph_sync_free:
                guarded(res["shapes"][name], "graph_sync_free", bench_graph, SHAPES[name], dist.group.WORLD, True)
                torch.cuda.empty_cache()
    for name in a.shapes:
        shape = SHAPES[name]
        r = res["shapes"][name]
        for key, fn, args in (("experts", bench_experts, (shape,)), ("permute", bench_permute, (shape, copy_gbps)),
                              ("layer", bench_layer, (shape, dist.group.WORLD)),
                              ("megatron", bench_megatron, (shape,))):
            if key in a.sections and not (key == "megatron" and a.skip_megatron):
                guarded(r, key, fn, *args)
        torch.cuda.empty_cache()
        save()
    if "step" in a.sections:
        guarded(res, "step", bench_step, dist.group.WORLD, a.step_rounds, a.step_batch)
    save()
    print_table(res)
    dist.destroy_process_group()
    return 0


def print_table(res: dict) -> None:
    c = res.get("ceilings", {})
    print(f"ceilings: matmul {c.get('matmul_bf16_tflops')} TFLOP/s, copy {c.get('copy_GBps')} GB/s")
    for name, r in res["shapes"].items():
        e = r.get("experts", {})
        if "ours" in e:
            print(f"{name} experts: raw {e['raw_grouped_mm']['tflops']} ours {e['ours']['tflops']} TFLOP/s "
                  f"({e['ours_vs_raw']:.3f}); torch-swiglu {e['ablation_torch_swiglu']['tflops']} "
                  f"pageable-offs {e['ablation_pageable_offsets']['tflops']} before {e['ablation_before_fixes']['tflops']} "
                  f"err {e['rel_err_vs_fp32']}")
        else:
            print(name, "experts", e.get("error"))
        for op, row in r.get("permute", {}).items():
            if "fused" in row:
                print(f"  {op:<20} fused {row['fused']['GBps']:>7} GB/s ({row['fused']['frac_copy']:.2f})  "
                      f"torch {row['torch']['GBps']:>7} GB/s ({row['torch']['frac_copy']:.2f})")
        for sched, row in r.get("layer", {}).items():
            if isinstance(row, dict) and "fwd" in row:
                print(f"  layer {sched:<9} fwd {row['fwd']['median_ms']:.3f} ms  fwd+bwd {row['fwd_bwd']['median_ms']:.3f} ms "
                      f"({row['fwd_bwd_vs_none']:.3f})  torch-elementwise {row['fwd_bwd_torch_elementwise']['median_ms']:.3f}"
                      f"  peak+ {row['peak_extra_bytes'] / 2**20:.0f} MiB  syncs {len(row['host_syncs_fwd_bwd'])}")
            elif sched == "error":
                print("  layer error", row)
        for key in ("graph", "graph_sync_free"):
            _print_graph(key, r.get(key, {}), e.get("raw_grouped_mm", {}).get("median_ms", 0.0))
        m = r.get("megatron", {})
        print(f"  megatron: {m.get('fwd', {}).get('median_ms')} / {m.get('fwd_bwd', {}).get('median_ms')} ms "
              f"{m.get('error', '')}")
    for name, row in res.get("step", {}).get("modes", {}).items():
        busy = row.get("profile", {}).get("gpu_busy_frac", "")
        print(f"step {name:<11} {row['median_ms']:8.2f} ms (min {row['min_ms']:.2f})  vs none "
              f"{row['vs_none_median_of_ratios']:.3f}  peak {row['peak_memory_bytes'] / 2**20:.0f} MiB  gpu busy {busy}"
              f"  gpu kernels vs none {row.get('gpu_kernel_vs_none')}")
    if "error" in res.get("step", {}):
        print("step error", res["step"]["error"])


if __name__ == "__main__":
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
