"""The benchmarks' shared timing and probing helpers: CUDA events (cuda_time), the all-rank Clock of the
spawned benchmarks (ep_overlap, peers), ceilings, the profiler and host syncs."""

from __future__ import annotations

import contextlib
import os
import statistics
import time
import traceback
import warnings

import torch
import torch.distributed as dist


def cuda_time(fn, warmup: int = 3, iters: int = 10, min_warm_ms: float = 30.0) -> dict:
    """Median/min ms of fn over `iters` back-to-back iterations (events between them).

    Warm-up runs `warmup` calls and then keeps going until `min_warm_ms` of wall time have passed, so that
    short kernels measured right after a host-bound section do not run at ramping clocks.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < min_warm_ms:
        fn()
        torch.cuda.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    events[0].record()
    for i in range(iters):
        fn()
        events[i + 1].record()
    torch.cuda.synchronize()
    ms = [events[i].elapsed_time(events[i + 1]) for i in range(iters)]
    return {"median_ms": statistics.median(ms), "min_ms": min(ms), "iters": iters}


@contextlib.contextmanager
def env(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old


def ceilings() -> dict:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = cuda_time(lambda: a @ b, warmup=3, iters=20)
    mm = 2 * 8192**3 / (t["median_ms"] * 1e-3) / 1e12
    src = torch.randn(2**30 // 2, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    dst = torch.empty_like(src)
    t2 = cuda_time(lambda: dst.copy_(src), warmup=3, iters=20)
    bw = 2 * src.numel() * 2 / (t2["median_ms"] * 1e-3) / 1e9
    return {"matmul_bf16_tflops": round(mm, 1), "matmul_ms": t["median_ms"],
            "copy_GBps": round(bw, 1), "copy_bytes_moved": 2 * 2**30}


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def profile_iter(fn, iters: int = 3) -> dict:
    """Wall time per iteration vs GPU kernel time per iteration (torch.profiler), top host ops."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    wall_ms = (time.perf_counter() - t0) * 1e3 / iters
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    avg = prof.key_averages()
    # Kernels only (device-side events); the CPU-side op entries carry the same device time again.
    gpu_us = sum(e.self_device_time_total for e in avg if e.device_type == DeviceType.CUDA) / iters
    top_cpu = sorted(avg, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    top_gpu = sorted((e for e in avg if e.device_type == DeviceType.CUDA),
                     key=lambda e: e.self_device_time_total, reverse=True)[:10]
    return {"wall_ms": round(wall_ms, 3), "gpu_kernel_ms": round(gpu_us / 1e3, 3),
            "gpu_busy_frac": round(gpu_us / 1e3 / wall_ms, 3),
            "host_ops_per_iter": round(sum(e.count for e in avg if e.self_cpu_time_total > 0) / iters, 1),
            "top_self_cpu": [(e.key, e.count // iters, round(e.self_cpu_time_total / iters / 1e3, 3)) for e in top_cpu],
            "top_self_gpu": [(e.key[:60], e.count // iters, round(e.self_device_time_total / iters / 1e3, 3))
                             for e in top_gpu]}


def host_syncs(fn) -> list[str]:
    """Run fn under torch's CUDA sync debug mode; one entry (innermost repo frame) per synchronizing call."""
    found = []

    def show(message, category, filename, lineno, file=None, line=None):
        if "prototype feature" in str(message):
            return
        # The three innermost Python frames: which line of ours, through which helper.
        frames = [f for f in traceback.extract_stack()[:-1] if not f.filename.endswith("warnings.py")][-3:]
        found.append(" <- ".join(f"{f.filename.split('/')[-1]}:{f.lineno} {f.name}" for f in reversed(frames)))

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        old_show = warnings.showwarning
        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = old_show
    torch.cuda.synchronize()
    return found


class Clock:
    """Times one call after a barrier of all ranks; keeps every sample under its key."""

    def __init__(self, group, device: torch.device, warmup: int) -> None:
        self.group, self.device, self.warmup = group, device, warmup
        self.round = 0
        self.samples: dict[str, list[float]] = {}
        self._token = torch.zeros(1, device=device)

    def barrier(self) -> None:
        # An all-reduce + device sync (NCCL's barrier needs the device ids it is not given here).
        dist.all_reduce(self._token, group=self.group)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self, key: str, fn):
        import time

        self.barrier()
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            out = fn()
            # Host issue time: how long the host took to queue the call (it blocks only where the code
            # syncs). Close to the GPU time means host-bound: overlap on the GPU cannot shorten the call.
            host = (time.perf_counter() - t0) * 1e3
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            out = fn()
            ms = host = (time.perf_counter() - t0) * 1e3
        if self.round >= self.warmup:
            self.samples.setdefault(key, []).append(ms)
            self.samples.setdefault(f"{key}#host", []).append(host)
        return out

    def summary(self) -> dict[str, dict[str, float]]:
        """Per key: median and min over rounds of the slowest rank's time (ms)."""
        out = {}
        for key in sorted(self.samples):  # same order on every rank: the all-reduces must match
            t = torch.tensor(self.samples[key], dtype=torch.float64, device=self.device)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            worst = t.cpu().tolist()
            out[key] = {"median_ms": statistics.median(worst), "min_ms": min(worst), "n": len(worst)}
        return out
