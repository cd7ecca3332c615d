"""Host ops of one EP 1 MoE layer forward + backward on CUDA, by name: what the host issues per step.

Why: at the Qwen3-30B-A3B shape the EP 1 layer is host-bound (benchmarks/gpu/gpu_layer.py, GPU busy 0.6-0.8), so an
op added to the layer's path costs wall time even when it saves GPU time. This counts them (torch.profiler, CPU
activity, events with self time > 0, per iteration), so two versions can be compared name by name.

    python benchmarks/gpu/host_ops.py --out after.json
    PYTHONPATH=<older checkout>:$PYTHONPATH python benchmarks/gpu/host_ops.py --out before.json
    python benchmarks/gpu/host_ops.py --diff before.json after.json     # the names whose counts differ
    python benchmarks/gpu/host_ops.py --device cpu --shape small         # the CPU path (verify's default ranks)

Each run also times the step (median of 30, after 5 warm-up steps; CUDA: synchronised before and after).

Results: benchmarks/results/h200x2_2026-11-29_r4/call*_host_ops_<commit>.json (one H200, bf16).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# D, F, E, K (4096 tokens; "small": 512, a CPU-sized layer)
SHAPES = {"qwen3-30b-a3b": (2048, 768, 16, 8), "deepseek-v3": (7168, 2048, 32, 8), "small": (256, 128, 16, 4)}


def count(shape: str, device: str = "cuda", iters: int = 4) -> tuple[dict[str, float], float]:
    """Returns ({op name: count per step}, median step ms)."""
    import statistics
    import time

    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.verify.run.ranks import free_port

    cuda = device == "cuda"
    if cuda:
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    hidden, ffn, experts, topk = SHAPES[shape]
    tokens = 512 if shape == "small" else 4096
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    layer = MoELayer(hidden, ffn, experts, topk, None, dtype=dtype, device=device, seed=None)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, hidden, device=device, dtype=dtype)

    def step():
        out, aux = layer(x)
        torch.autograd.backward([out, aux], [g, torch.ones_like(aux)])

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for _ in range(5):
        step()
    sync()
    times = []
    for _ in range(30):
        t0 = time.perf_counter()
        step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(iters):
            step()
        sync()
    if cuda:
        dist.destroy_process_group()
    ops = {e.key: e.count / iters for e in prof.key_averages() if e.self_cpu_time_total > 0}
    return ops, statistics.median(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--diff", nargs=2, type=Path, metavar=("BEFORE", "AFTER"))
    a = ap.parse_args()
    if a.diff:
        before, after = ({k: v for k, v in json.loads(p.read_text()).items() if not k.startswith("#")}
                         for p in a.diff)
        print(f"{'op':60s} {'before':>8s} {'after':>8s}")
        for k in sorted(set(before) | set(after)):
            if before.get(k, 0) != after.get(k, 0):
                print(f"{k:60s} {before.get(k, 0):8.1f} {after.get(k, 0):8.1f}")
        print(f"{'total':60s} {sum(before.values()):8.1f} {sum(after.values()):8.1f}")
        return 0
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run this on the GPU machine, or pass --device cpu", file=sys.stderr)
        return 2
    rows, step_ms = count(a.shape, a.device)
    text = json.dumps({**rows, "#step_ms": round(step_ms, 4)}, indent=0, sort_keys=True)
    if a.out:
        a.out.write_text(text + "\n")
    print(f"{a.shape} on {a.device}: {sum(rows.values()):.1f} host ops per layer forward + backward, "
          f"step {step_ms:.3f} ms (median of 30)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
