"""MoE layer benchmark: forward and backward time per schedule (none, chunked C) for one shape.

    python benchmarks/gpu/layer.py --device cpu --ranks 2                        # gloo ranks on CPU
    python benchmarks/gpu/layer.py --device cuda --ranks 8 --preset gpu          # NCCL, one GPU per rank

Each rank runs the same layer (forced-balance routing, so timings do not depend on routing skew)
on its own tokens. The schedules are interleaved round by round so that noise on a shared machine
hits all of them alike; the table shows the median over rounds of the slowest rank's time.

To explain the ratio, the same rank processes also time the pieces of the ``none`` forward in
isolation: the count exchange, one all-to-all of the dispatched rows (the combine moves the same
bytes back), and the experts' forward on the received rows. Chunking can at best hide
min(comm, compute); it adds C-1 more rounds of each collective's fixed latency and smaller GEMMs.

Writes benchmarks/results/layer_<device>_r<ranks>.json (command, date, machine, versions, shape, rows).
"""

from __future__ import annotations

import argparse
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

PRESETS = {
    # Communication-heavy on CPU: wide rows (D=1024), thin experts (F=16): an all-to-all moves
    # T*K*D*4 bytes per rank while the experts do 6*D*F flops per row.
    "cpu-comm-heavy": dict(tokens=1024, hidden=1024, ffn=16, experts=8, topk=2),
    "cpu-compute-heavy": dict(tokens=512, hidden=256, ffn=1024, experts=8, topk=2),
    # Qwen3-30B-A3B-like expert shape (hidden 2048, ffn 768, top-8 of 128), 4096 tokens per rank.
    "gpu": dict(tokens=4096, hidden=2048, ffn=768, experts=128, topk=8),
}


def _sync(device):
    from moe_overlap.ep.streams import synchronize

    synchronize(device)


def _timed(fn, device):
    _sync(device)
    t0 = time.perf_counter()
    out = fn()
    _sync(device)
    return out, time.perf_counter() - t0


class WaitClock:
    """Host time spent blocked in ``A2AHandle.wait`` (instrumentation of this benchmark process only)."""

    def __init__(self):
        from moe_overlap.ep import all_to_all

        self.total = 0.0
        original = all_to_all.A2AHandle.wait
        clock = self

        def timed_wait(handle):
            t0 = time.perf_counter()
            try:
                return original(handle)
            finally:
                clock.total += time.perf_counter() - t0

        all_to_all.A2AHandle.wait = timed_wait

    def lap(self) -> float:
        t, self.total = self.total, 0.0
        return t


def bench_body(rank, world, group, shape, device_type, dtype_name, rounds, chunk_list):
    import torch.distributed as dist

    from moe_overlap.ep.all_to_all import all_to_all_sync
    from moe_overlap.ep.counts import exchange_counts, make_dispatch_plan
    from moe_overlap.ep.dispatcher import (
        permute_rows,
        plan_permute,
        sort_rows,
        unpermute_rows,
        unsort_rows,
    )
    from moe_overlap.ep.experts import experts_forward
    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.ep.router import route
    from moe_overlap.ep.streams import make_comm_stream

    device = torch.device(device_type, rank if device_type == "cuda" else 0) if device_type == "cuda" \
        else torch.device("cpu")
    dtype = getattr(torch, dtype_name)
    layer = MoELayer(shape["hidden"], shape["ffn"], shape["experts"], shape["topk"], group,
                     force_balance=True, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(rank)
    x0 = torch.randn(shape["tokens"], shape["hidden"], generator=gen).to(device, dtype)
    gout = torch.randn(shape["tokens"], shape["hidden"], generator=gen).to(device, dtype)
    stream = make_comm_stream(device)
    modes = [("none", 1)] + [("chunked", c) for c in chunk_list]
    fwd = {f"{s}:{c}": [] for s, c in modes}
    bwd = {k: [] for k in fwd}
    fwd_wait = {k: [] for k in fwd}
    bwd_wait = {k: [] for k in fwd}
    cpu = {k: [] for k in fwd}  # CPU time of this rank's main thread over fwd+bwd
    clock = WaitClock()
    parts = {"route+permute": [], "count exchange": [], "dispatch a2a": [], "sort+unsort": [],
             "experts fwd": [], "combine a2a": [], "unpermute": []}
    for r in range(rounds + 1):  # round 0 is warm-up
        for schedule, chunks in modes:
            key = f"{schedule}:{chunks}"
            layer.zero_grad(set_to_none=True)
            x = x0.clone().requires_grad_()
            dist.barrier(group)
            clock.lap()
            c0 = time.thread_time()
            (out, _), tf = _timed(lambda s=schedule, c=chunks, x=x: layer(
                x, schedule=s, chunks=c, comm_stream=stream), device)
            wf = clock.lap()
            _, tb = _timed(lambda out=out: out.backward(gout), device)
            wb, c2 = clock.lap(), time.thread_time()
            if r:
                fwd[key].append(tf)
                bwd[key].append(tb)
                fwd_wait[key].append(wf)
                bwd_wait[key].append(wb)
                cpu[key].append(c2 - c0)
        dist.barrier(group)
        with torch.no_grad():
            routing, t_route = _timed(lambda: route(x0, layer.router.weight, topk=layer.topk, force_balance=True),
                                      device)
            pplan, t_perm = _timed(lambda r_=routing: plan_permute(r_.experts_TK, layer.num_experts), device)
            x_ND, t_rows = _timed(lambda p=pplan: permute_rows(x0, p), device)
            dist.barrier(group)
            (send, recv), t_counts = _timed(lambda p=pplan: exchange_counts(
                p.tokens_per_expert_E.unsqueeze(0), layer.num_experts, group), device)
            plan = make_dispatch_plan(pplan, send[0], recv[0])
            dist.barrier(group)
            recv_x, t_a2a = _timed(lambda p=plan, xn=x_ND: all_to_all_sync(xn, p.recv_splits, p.send_splits, group),
                                   device)
            xs, t_sort = _timed(lambda p=plan, rx=recv_x: sort_rows(rx, p), device)
            (y, _), t_exp = _timed(lambda p=plan, xs=xs: experts_forward(
                xs, layer.experts.w1, layer.experts.w2, p.tokens_per_local_expert), device)
            yr, t_unsort = _timed(lambda p=plan, y=y: unsort_rows(y, p), device)
            dist.barrier(group)
            y_ND, t_comb = _timed(lambda p=plan, yr=yr: all_to_all_sync(yr, p.send_splits, p.recv_splits, group),
                                  device)
            _, t_unperm = _timed(lambda p=pplan, yn=y_ND, r_=routing: unpermute_rows(yn, r_.probs_TK, p), device)
        if r:
            for name, t in (("route+permute", t_route + t_perm + t_rows), ("count exchange", t_counts),
                            ("dispatch a2a", t_a2a), ("sort+unsort", t_sort + t_unsort), ("experts fwd", t_exp),
                            ("combine a2a", t_comb), ("unpermute", t_unperm)):
                parts[name].append(t)
    # the slowest rank decides each round's time
    def worst(values):
        t = torch.tensor(values, dtype=torch.float64, device=device)  # NCCL reduces device tensors only
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return statistics.median(t.cpu().tolist()) * 1e3

    table = {k: {"fwd_ms": worst(fwd[k]), "bwd_ms": worst(bwd[k]), "fwd_blocked_in_a2a_ms": worst(fwd_wait[k]),
                 "bwd_blocked_in_a2a_ms": worst(bwd_wait[k]), "main_thread_cpu_ms": worst(cpu[k])} for k in fwd}
    pieces = {k: worst(v) for k, v in parts.items()}
    pieces["sum of pieces"] = sum(pieces.values())
    return {"table": table, "pieces_ms": pieces, "expert_path": layer.expert_path(x0),
            "bytes_per_dispatch": int(x_ND.numel() * x_ND.element_size())}


def print_run(res, rep, args, backend, dtype, shape) -> list[dict]:
    none = res["table"]["none:1"]
    rows = []
    print(f"[run {rep}] MoE layer, {args.ranks} ranks ({backend}), {dtype}, shape {shape}, "
          f"expert path {res['expert_path']}")
    print(f"{'schedule':<12}{'fwd ms':>10}{'bwd ms':>10}{'fwd+bwd':>10}{'vs none':>9}"
          f"{'fwd blocked':>13}{'bwd blocked':>13}{'main cpu':>10}")
    for key, t in res["table"].items():
        total = t["fwd_ms"] + t["bwd_ms"]
        ratio = total / (none["fwd_ms"] + none["bwd_ms"])
        rows.append({"schedule": key.split(":")[0], "chunks": int(key.split(":")[1]), **t,
                     "total_ms": total, "ratio_vs_none": ratio})
        print(f"{key:<12}{t['fwd_ms']:>10.2f}{t['bwd_ms']:>10.2f}{total:>10.2f}{ratio:>9.3f}"
              f"{t['fwd_blocked_in_a2a_ms']:>13.2f}{t['bwd_blocked_in_a2a_ms']:>13.2f}{t['main_thread_cpu_ms']:>10.2f}")
    print("blocked = host time inside A2AHandle.wait (waiting for the peer and the transfer); main cpu = CPU time"
          " of the rank's main thread over fwd+bwd; wall - cpu - blocked = time the thread was runnable but"
          " not running (descheduled). Medians of the slowest rank.")
    print("pieces of the none forward, measured alone (ms):",
          ", ".join(f"{k} {v:.2f}" for k, v in res["pieces_ms"].items()))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--preset", choices=sorted(PRESETS), default=None)
    ap.add_argument("--tokens", type=int)
    ap.add_argument("--hidden", type=int)
    ap.add_argument("--ffn", type=int)
    ap.add_argument("--experts", type=int)
    ap.add_argument("--topk", type=int)
    ap.add_argument("--chunks", default="2,4", help="comma-separated chunk counts for the chunked schedule")
    ap.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=1, help="independent launches (fresh rank processes)")
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    preset = args.preset or ("gpu" if args.device == "cuda" else "cpu-comm-heavy")
    shape = dict(PRESETS[preset])
    for k in shape:
        if getattr(args, k) is not None:
            shape[k] = getattr(args, k)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    chunk_list = [int(c) for c in args.chunks.split(",") if c]
    from moe_overlap.verify.run.ranks import spawn_ranks

    backend = "nccl" if args.device == "cuda" else "gloo"
    runs = []
    for rep in range(args.repeats):
        load_before = os.getloadavg()
        res = spawn_ranks(bench_body, args.ranks, (shape, args.device, dtype, args.rounds, chunk_list),
                          timeout=args.timeout, backend=backend, pass_group=True,
                          start_method="fork" if backend == "gloo" else "spawn")[0]
        rows = print_run(res, rep, args, backend, dtype, shape)
        runs.append({"load_average_before": load_before, "load_average_after": os.getloadavg(), "rows": rows,
                     "pieces_ms": res["pieces_ms"]})
    summary = {}
    for row in runs[0]["rows"]:
        key = f"{row['schedule']}:{row['chunks']}"
        ratios = [r["ratio_vs_none"] for run in runs for r in run["rows"]
                  if f"{r['schedule']}:{r['chunks']}" == key]
        summary[key] = {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
                        "ratio_max": max(ratios)}
    if args.repeats > 1:
        print("ratio (fwd+bwd) vs none over repeats: " + ", ".join(
            f"{k} median {v['ratio_median']:.3f} [{v['ratio_min']:.3f}, {v['ratio_max']:.3f}]"
            for k, v in summary.items()))
    out = args.out or ROOT / "benchmarks" / "results" / f"layer_{args.device}_r{args.ranks}_{preset}.json"
    doc = {
        "command": "python " + " ".join([str(Path(sys.argv[0]).relative_to(ROOT)
                                             if Path(sys.argv[0]).is_absolute() else sys.argv[0])] + sys.argv[1:]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpu_count": os.cpu_count(), "load_average_after": os.getloadavg(),
                    "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                    "note": "load averages per repeat are in runs[]; a high load means CPU shared with other jobs"},
        "versions": {"python": platform.python_version(), "torch": torch.__version__},
        "preset": preset, "shape": shape, "ranks": args.ranks, "backend": backend, "dtype": dtype,
        "rounds": args.rounds, "repeats": args.repeats, "expert_path": res["expert_path"],
        "bytes_per_dispatch_per_rank": res["bytes_per_dispatch"], "summary": summary, "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
