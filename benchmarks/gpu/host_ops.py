"""Host ops of one EP 1 MoE layer forward + backward on CUDA, by name: what the host issues per step.

Why: at the Qwen3-30B-A3B shape the EP 1 layer is host-bound (benchmarks/gpu/gpu_layer.py, GPU busy 0.6-0.8), so an
op added to the layer's path costs wall time even when it saves GPU time. This counts them (torch.profiler, CPU
activity, events with self time > 0, per iteration), so two versions can be compared name by name.

    python benchmarks/gpu/host_ops.py --out after.json
    PYTHONPATH=<older checkout>:$PYTHONPATH python benchmarks/gpu/host_ops.py --out before.json
    python benchmarks/gpu/host_ops.py --diff before.json after.json     # the names whose counts differ
    python benchmarks/gpu/host_ops.py --device cpu --shape small         # the CPU path (verify's default ranks)
    python benchmarks/gpu/host_ops.py --device cpu --shape small --ranks 2 --out ep2.json   # EP 2 on gloo ranks

With ``--ranks R > 1`` it spawns R ranks (gloo on CPU; NCCL, one GPU each, on CUDA) and counts rank 0's ops for
the default EP path (host splits: counts read with ``.tolist()``) and the sync-free one (ep/sync_free.py), for
one layer forward + backward and for one 1F1B layer pair (schedule_1f1b.layer_pair: the forward of one
micro-batch interleaved with the backward of another through a one-layer model's nodes, attention included);
the JSON holds both paths, their totals, the command, date and machine.

Each run also times the step (median of 30, after 5 warm-up steps; CUDA: synchronised before and after).

Results: benchmarks/results/h200x2_2026-11-29_r4/call*_host_ops_<commit>.json (one H200, bf16);
benchmarks/results/host_ops_ep2_cpu.json (EP 2, CPU gloo ranks, default vs sync-free).
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


def _ops(prof, iters: int) -> dict[str, float]:
    return {e.key: e.count / iters for e in prof.key_averages() if e.self_cpu_time_total > 0}


def _pair_ops(prof, iters: int) -> dict[str, float]:
    """Ops inside the ``layer_pair`` marker only (the set-up of each iteration's runs is outside it)."""
    events = [e for e in prof.events() if e.device_type.name == "CPU"]
    marks = [e for e in events if e.name == "layer_pair"]
    out: dict[str, float] = {}
    for e in events:
        if e.name == "layer_pair" or e.self_cpu_time_total <= 0:
            continue
        if any(m.thread == e.thread and m.time_range.start <= e.time_range.start and e.time_range.end <= m.time_range.end
               for m in marks):
            out[e.name] = out.get(e.name, 0.0) + 1.0 / iters
    return out


def _rank_counts(rank: int, world: int, group, shape: str, iters: int, timed_runs: int = 10,
                 graphs: bool = False) -> dict:
    """One rank: the layer and the 1F1B pair, default path then sync-free path."""
    import statistics
    import time

    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.ep.model import ModelConfig, MoETransformer
    from moe_overlap.ep.nodes import MicroBatchRun, NodeContext
    from moe_overlap.ep.schedule_1f1b import layer_forward, layer_pair
    from moe_overlap.ep.wgrad import WgradStore

    cuda = torch.cuda.is_available() and torch.distributed.get_backend(group) == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    hidden, ffn, experts, topk = SHAPES[shape]
    tokens = 512 if shape == "small" else 4096
    torch.manual_seed(rank)
    layer = MoELayer(hidden, ffn, experts, topk, group, dtype=dtype, device=device, seed=None)
    x = torch.randn(tokens, hidden, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(tokens, hidden, device=device, dtype=dtype)
    cfg = ModelConfig(vocab_size=64, hidden=hidden, ffn=ffn, num_heads=max(1, hidden // 64), num_layers=1,
                      num_experts=experts, topk=topk)
    model = MoETransformer(cfg, group).to(device=device, dtype=dtype)
    batch = (2, tokens // 2)

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def timed(fn, n=timed_runs):
        for _ in range(min(3, n)):
            fn()
        sync()
        ts = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(ts)

    out = {}
    paths = [("default", False, None), ("sync_free", True, None)]
    if graphs:  # the layer from graph_layer; the pair's experts nodes from node_graphs (without delayed wgrad)
        from moe_overlap.ep.graphed import graph_layer
        from moe_overlap.ep.node_graphs import ExpertGraphs

        paths.append(("sync_free+graphs", True, (graph_layer(layer, x, sync_free=True), ExpertGraphs())))
    for path, sync_free, graphed in paths:
        def layer_step(sf=sync_free, graphed=graphed):
            out_, aux = layer(x, sync_free=sf) if graphed is None else graphed[0](x)
            torch.autograd.backward([out_, aux], [g, torch.ones_like(aux)])

        def pair(sf=sync_free, mark=False, graphed=graphed):
            store = WgradStore() if graphed is None else None
            ctx = NodeContext(group=group, comm_stream=None, store=store, grad_scale=0.5, sync_free=sf,
                              graphs=None if graphed is None else graphed[1])
            gen = torch.Generator().manual_seed(rank)
            runs = [MicroBatchRun(model, torch.randint(0, 64, batch, generator=gen).to(device),
                                  torch.randint(0, 64, batch, generator=gen).to(device), ctx, slot=k) for k in range(2)]
            y0 = layer_forward(runs[0].layers[0], runs[0].embed_forward())
            x1 = runs[1].embed_forward()
            with record_function("layer_pair") if mark else _null():
                layer_pair(runs[1].layers[0], runs[0].layers[0], x1, torch.ones_like(y0), store)

        row = {"layer_ms": timed(layer_step), "pair_ms": timed(pair)}
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iters):
                layer_step()
            sync()
        row["layer"] = _ops(prof, iters)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(iters):
                pair(mark=True)
            sync()
        row["pair"] = _pair_ops(prof, iters)
        out[path] = row
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def count_ep(shape: str, device: str, world: int, iters: int = 4, timed_runs: int = 10, graphs: bool = False) -> dict:
    """Spawn ``world`` ranks; rank 0's counts for both paths (layer and 1F1B pair)."""
    from moe_overlap.verify.run.ranks import spawn_ranks

    backend = "nccl" if device == "cuda" else "gloo"
    results = spawn_ranks(_rank_counts, world, (shape, iters, timed_runs, graphs), backend=backend, pass_group=True, timeout=900,
                          start_method="fork" if backend == "gloo" else "spawn")
    return results[0]


def _ep_document(a, res: dict) -> dict:
    import datetime
    import os
    import platform

    import torch

    doc = {"#command": "python benchmarks/gpu/host_ops.py " + " ".join(sys.argv[1:]),
           "#date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "#machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "torch": torch.__version__,
                        "device": a.device, "ranks": a.ranks, "shape": a.shape},
           "#counted": "rank 0, torch.profiler CPU events with self time > 0, per iteration; the pair: the ops "
                       "inside schedule_1f1b.layer_pair only"}
    for path, row in res.items():
        doc[path] = {"layer_total": round(sum(row["layer"].values()), 1), "pair_total": round(sum(row["pair"].values()), 1),
                     "layer_step_ms_median": round(row["layer_ms"], 3), "pair_ms_median": round(row["pair_ms"], 3),
                     "layer": row["layer"], "pair": row["pair"]}
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", choices=list(SHAPES), default="qwen3-30b-a3b")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--ranks", type=int, default=1, help="EP ranks (> 1: spawned; default vs sync-free path)")
    ap.add_argument("--graphs", action="store_true", help="with --ranks > 1 on CUDA: also the sync-free path graphed "
                    "(the layer by graph_layer; the 1F1B pair's experts nodes by node_graphs, without delayed wgrad)")
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
    if a.ranks > 1:
        if a.graphs and a.device != "cuda":
            print("--graphs needs --device cuda (CUDA graphs)", file=sys.stderr)
            return 2
        doc = _ep_document(a, count_ep(a.shape, a.device, a.ranks, graphs=a.graphs))
        if a.out:
            a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        for path in [k for k in doc if not k.startswith("#")]:
            d = doc[path]
            print(f"{a.shape} on {a.device}, EP {a.ranks}, {path}: {d['layer_total']:.1f} host ops per layer forward + "
                  f"backward ({d['layer_step_ms_median']:.3f} ms), {d['pair_total']:.1f} per 1F1B layer pair "
                  f"({d['pair_ms_median']:.3f} ms with its set-up)")
        return 0
    rows, step_ms = count(a.shape, a.device)
    text = json.dumps({**rows, "#step_ms": round(step_ms, 4)}, indent=0, sort_keys=True)
    if a.out:
        a.out.write_text(text + "\n")
    print(f"{a.shape} on {a.device}: {sum(rows.values()):.1f} host ops per layer forward + backward, "
          f"step {step_ms:.3f} ms (median of 30)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
