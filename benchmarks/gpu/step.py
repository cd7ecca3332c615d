"""Training-step benchmark: step time and peak memory for plain / none / chunked / 1f1b / 1f1b+wgrad.

    python benchmarks/gpu/step.py --device cpu --world 2 4          # gloo ranks on CPU (CI-sized model)
    python benchmarks/gpu/step.py --device cuda --preset gpu        # EP 1 on one GPU (the lent H200)

One call of `moe_overlap.ep.step.forward_backward` (forward + backward of M micro-batches, gradients
reduced) is one step; the optimizer is not timed. Every mode runs in the same rank processes on a
model built from the same seed; the modes are interleaved round by round so machine noise (the CPU
box is shared) hits all of them alike; the table shows the median over rounds (max over ranks).

Memory: on CUDA `torch.cuda.max_memory_allocated` (reset before each mode). On CPU there is no
allocator counter: the warm-up round runs under `torch.profiler` with `profile_memory=True` and the
peak of (allocated - freed) bytes over the step is reported (what the step adds on top of the
parameters and everything alive before it). The 1F1B schedule holds two micro-batches' activations
where the sequential one holds one.

Writes benchmarks/results/step_<device>.json (command, date, machine, versions, config, rows).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

# name -> (schedule, delay_wgrad); "plain" is MoELayer's autograd path without nodes (the cost of the
# node machinery shows as none/plain; the cost of the 1F1B reordering as 1f1b/none).
MODES = {"plain": ("plain", False), "none": ("none", False), "chunked": ("chunked", False),
         "1f1b": ("1f1b", False), "1f1b+wgrad": ("1f1b", True)}
PRESETS = {
    "cpu": dict(vocab_size=256, hidden=128, ffn=128, num_heads=4, num_layers=2, num_experts=8, topk=2,
                batch=2, seq=128, micro_batches=4),
    "gpu": dict(vocab_size=4096, hidden=2048, ffn=1024, num_heads=16, num_layers=4, num_experts=16, topk=4,
                batch=4, seq=1024, micro_batches=4),
}


def cpu_peak_bytes(prof) -> int:
    """Peak of (bytes allocated - bytes freed) over a profiled region, from the profiler's memory events."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = 0
    for e in sorted(events, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak


def _batches(cfg, preset, rank, step, device):
    gen = torch.Generator().manual_seed(7919 * step + rank)
    out = []
    for _ in range(preset["micro_batches"]):
        tok = torch.randint(0, cfg.vocab_size, (preset["batch"], preset["seq"] + 1), generator=gen)
        out.append((tok[:, :-1].contiguous().to(device), tok[:, 1:].contiguous().to(device)))
    return out


def bench_body(rank, world, group, preset, device_type, rounds, chunks, dtype_name):
    from torch.profiler import ProfilerActivity, profile

    from moe_overlap.ep.model import ModelConfig, MoETransformer
    from moe_overlap.ep.step import autograd_forward_backward, forward_backward
    from moe_overlap.ep.streams import make_comm_stream, synchronize

    device = torch.device(device_type)
    dtype = getattr(torch, dtype_name)
    fields = {k: v for k, v in preset.items() if k not in ("batch", "seq", "micro_batches")}
    cfg = ModelConfig(**fields)
    model = MoETransformer(cfg, group).to(device=device, dtype=dtype)
    stream = make_comm_stream(device)
    times = {name: [] for name in MODES}
    mem = dict.fromkeys(times, 0)
    for r in range(rounds + 1):  # round 0 is warm-up (allocator, lazy init, gloo connections)
        batches = _batches(cfg, preset, rank, r, device)
        for name, (schedule, delay) in MODES.items():
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            synchronize(device)
            torch.distributed.barrier(group)
            # The memory profiler costs time: on CPU only the warm-up round runs under it.
            hooks = r == 0 and device.type == "cpu"
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) if hooks \
                    else contextlib.nullcontext() as prof:
                if schedule == "plain":
                    autograd_forward_backward(model, batches, layer_schedule="none", chunks=1, group=group,
                                              streams=stream)
                else:
                    forward_backward(model, batches, schedule=schedule, delay_wgrad=delay, chunks=chunks,
                                     group=group, streams=stream)
            synchronize(device)
            dt = time.perf_counter() - t0
            model.zero_grad(set_to_none=True)
            if hooks:
                mem[name] = cpu_peak_bytes(prof)
            if r == 0:
                continue
            times[name].append(dt)
            if device.type == "cuda":
                mem[name] = max(mem[name], int(torch.cuda.max_memory_allocated(device)))
    return {"times": times, "mem": mem}


def run(device: str, worlds: list[int], preset_name: str, rounds: int, chunks: int, dtype: str) -> dict:
    from moe_overlap.verify.run.ranks import spawn_ranks

    preset = PRESETS[preset_name]
    rows = []
    for world in worlds:
        if device == "cuda":  # EP 1 in this process: a 1-rank gloo group, no collective is launched
            per_rank = [_single_rank(preset, rounds, chunks, dtype)]
        else:
            per_rank = spawn_ranks(bench_body, world, (preset, device, rounds, chunks, dtype), timeout=1800,
                                   pass_group=True, start_method="fork")
        def med(name, per_rank=per_rank):
            return statistics.median([max(r["times"][name][i] for r in per_rank) for i in range(rounds)])

        for name in MODES:
            per_round = [max(r["times"][name][i] for r in per_rank) for i in range(rounds)]
            rows.append({"world": world, "mode": name, "step_ms_median": round(med(name) * 1e3, 3),
                         "step_ms_min": round(min(per_round) * 1e3, 3),
                         "vs_none": round(med(name) / med("none"), 3),
                         "vs_plain": round(med(name) / med("plain"), 3),
                         "peak_memory_bytes": max(r["mem"][name] for r in per_rank),
                         "memory_kind": "cuda_max_allocated" if device == "cuda" else "cpu_profiler_peak_over_step"})
    return {"preset": preset_name, "config": preset, "rounds": rounds, "chunks": chunks, "dtype": dtype,
            "rows": rows}


def _single_rank(preset, rounds, chunks, dtype):
    import torch.distributed as dist

    from moe_overlap.verify.run.ranks import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    try:
        return bench_body(0, 1, dist.group.WORLD, preset, "cuda", rounds, chunks, dtype)
    finally:
        dist.destroy_process_group()


def markdown_table(result: dict) -> str:
    """The docs/benchmarks.md table for one results JSON."""
    lines = ["| EP ranks | mode | median ms | min ms | median / none | median / plain | peak MiB |",
             "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        lines.append(f"| {r['world']} | {r['mode']} | {r['step_ms_median']:.1f} | {r['step_ms_min']:.1f} | "
                     f"{r['vs_none']:.3f} | {r['vs_plain']:.3f} | {r['peak_memory_bytes'] / 2**20:.2f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", type=Path, default=None, help="print the table of a results JSON and exit")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--world", type=int, nargs="+", default=[2, 4], help="EP sizes (CPU); CUDA runs EP 1")
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None, help="model/batch size (default: device)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunks", type=int, default=2, help="chunks of the 'chunked' layer schedule")
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (CUDA default)")
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args()
    if a.markdown:
        print(markdown_table(json.loads(a.markdown.read_text())))
        return 0
    if a.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here; run it on the GPU machine", file=sys.stderr)
        return 2
    preset = a.preset or ("gpu" if a.device == "cuda" else "cpu")
    dtype = a.dtype or ("bfloat16" if a.device == "cuda" else "float32")
    worlds = [1] if a.device == "cuda" else a.world
    load_before = list(os.getloadavg())
    result = run(a.device, worlds, preset, a.rounds, a.chunks, dtype)
    result.update({
        "command": "python " + " ".join(sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "load_avg_1_5_15_before": load_before,
                    "load_avg_1_5_15_at_end": list(os.getloadavg()),
                    "gpu": torch.cuda.get_device_name() if a.device == "cuda" else None},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
    })
    print(f"{'world':>5} {'mode':<12} {'median ms':>10} {'min ms':>9} {'vs none':>8} {'vs plain':>9} {'peak MiB':>9}")
    for r in result["rows"]:
        print(f"{r['world']:>5} {r['mode']:<12} {r['step_ms_median']:>10.1f} {r['step_ms_min']:>9.1f} "
              f"{r['vs_none']:>8.3f} {r['vs_plain']:>9.3f} {r['peak_memory_bytes'] / 2**20:>9.2f}")
    out = a.out or ROOT / "benchmarks" / "results" / f"step_{a.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
