"""What each rank of benchmarks/gpu/profile_layer.py runs (spawned ranks import it by its module name)."""

from __future__ import annotations

import cProfile
import gzip
import pstats
from pathlib import Path

import torch
import torch.distributed as dist

REGIONS = ("none", "nodes", "1f1b", "1f1b+wgrad")


def _region_fns(layer, block, x0, x1, gout, ctx_for):
    """One callable per region; each runs one complete iteration and leaves no state behind."""
    from moe_overlap.ep.nodes import LayerRun
    from moe_overlap.ep.schedule_1f1b import layer_backward, layer_forward, layer_pair
    from moe_overlap.ep.wgrad import WgradStore

    x_BSD, x1_BSD, g_BSD = x0.unsqueeze(0), x1.unsqueeze(0), gout.unsqueeze(0)

    def none():
        out, _ = layer(x0.clone().requires_grad_(), **ctx_for("none"))
        out.backward(gout)

    def nodes():
        run = LayerRun(block, ctx_for("nodes"), 0.0)
        layer_forward(run, x_BSD)
        layer_backward(run, g_BSD, None)

    def pair(delay):
        store = WgradStore() if delay else None
        ctx = ctx_for("1f1b", store)
        b, f = LayerRun(block, ctx, 0.0), LayerRun(block, ctx, 0.0)
        layer_forward(b, x_BSD)  # outside the region: micro-batch k's forward
        return lambda: layer_pair(f, b, x1_BSD, g_BSD, store), lambda: (layer_backward(f, g_BSD, store),
                                                                         store and store.run_all())

    return {"none": none, "nodes": nodes, "1f1b": lambda: pair(False), "1f1b+wgrad": lambda: pair(True)}


def _run(fns, name, mark=None):
    """One iteration of region `name`; for the pair regions only the pair is inside `mark`."""
    from contextlib import nullcontext

    if name in ("none", "nodes"):
        with mark or nullcontext():
            fns[name]()
        return
    pair, finish = fns[name]()
    if torch.cuda.is_available() and mark is not None:
        torch.cuda.synchronize()  # micro-batch k's forward (queued above) must not run inside the window
    with mark or nullcontext():
        pair()
    finish()


def _host_profile(fns, layer, device, profiled: bool, iters=10) -> dict:
    """Every rank runs the iterations (they hold collectives); only ``profiled`` ranks record."""
    out = {}
    for name in REGIONS:
        prof = cProfile.Profile()
        if profiled:
            prof.enable()
        for _ in range(iters):
            _run(fns, name)
            layer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        prof.disable()
        if not profiled:
            continue
        stats = pstats.Stats(prof).stats
        rows = sorted(((v[2], k) for k, v in stats.items()), reverse=True)[:25]
        out[name] = [{"function": f"{Path(k[0]).name}:{k[1]}({k[2]})", "tottime_ms": t * 1e3 / iters}
                     for t, k in rows]
    return out


def profile_body(rank, world, group, presets, device_type, out_dir, a2a):
    from torch.profiler import ProfilerActivity, profile, record_function

    from benchmarks.gpu.ep_overlap_body import bench_transport, build_layer
    from benchmarks.gpu.trace_summary import load, summarize
    from moe_overlap.ep.nodes import NodeContext
    from moe_overlap.ep.streams import make_comm_stream

    device = torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16 if device_type == "cuda" else torch.float32
    stream = make_comm_stream(device)
    counts_group = dist.new_group(backend="gloo") if world > 1 else None
    results = []
    for name, shape in presets:
        transport, transport_why = bench_transport(a2a, shape, group, device, dtype)
        layer, block, x0, x1, gout = build_layer(shape, group, rank, device, dtype)

        def ctx_for(region, store=None, transport=transport):
            if region == "none":
                return {"counts_group": counts_group, "transport": transport}
            return NodeContext(group=group, comm_stream=stream if region == "1f1b" else None, store=store,
                               grad_scale=1.0, counts_group=counts_group, transport=transport)

        fns = _region_fns(layer, block, x0, x1, gout, ctx_for)
        for _ in range(3):  # warm-up: kernels compiled, allocator and NCCL buffers in place
            for region in REGIONS:
                _run(fns, region)
                layer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier(group)
        host = _host_profile(fns, layer, device, profiled=rank == 0)
        dist.barrier(group)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            for region in REGIONS:
                for i in range(3):
                    dist.barrier(group)
                    if device.type == "cuda":
                        torch.cuda.synchronize(device)
                    _run(fns, region, record_function(f"{region}#{i}"))
                    layer.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        path = Path(out_dir) / f"trace_{name}_r{world}_rank{rank}.json"
        prof.export_chrome_trace(str(path))
        summary = summarize(load(path))
        if rank == 0:
            with open(path, "rb") as src, gzip.open(str(path) + ".gz", "wb") as dst:
                dst.write(src.read())
        path.unlink()
        results.append({"preset": name, "shape": shape, "summary": summary, "host_profile": host,
                        "transport": transport_why})
        del layer, block, x0, x1, gout, transport
        if device.type == "cuda":
            torch.cuda.empty_cache()
    nccl = torch.cuda.nccl.version() if device_type == "cuda" else None
    return {"presets": results, "gpu": torch.cuda.get_device_name(device) if device_type == "cuda" else None,
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}}
