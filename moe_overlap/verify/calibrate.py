"""Measure this machine for the estimator: GEMM rate, copy rate, all-to-all cost, overlap efficiency.

``calibrate()`` is torch-free in the caller: it spawns ``world`` ranks (gloo on CPU, NCCL on CUDA), and each
rank measures with our own implementation (``moe_overlap.ep.experts.GroupedExperts`` for the expert GEMMs,
``torch.distributed.all_to_all_single`` as ``ep.all_to_all`` calls it). Every number is the median of
``repeats`` timed runs after warm-up, and the slowest rank's median (collectives finish together). The
machine may be shared (the CI/dev boxes here have 2 cores shared by several jobs): medians damp that,
they do not remove it.

What is measured (all on ``world`` ranks at once, each rank with one intra-op thread on CPU):
* expert_tflops: GroupedExperts forward + backward (dgrad and wgrad), 18*D*F FLOPs per row.
* dense_tflops: a square matmul.
* mem_gbps: a row gather (``index_select``), bytes read + written.
* a2a: ``all_to_all_single`` with a tiny and a large buffer: latency = tiny time; bandwidth = bytes that
  leave the rank / (large time - latency).
* overlap_efficiency: an async all-to-all started beside a matmul loop of about the same length;
  efficiency = (t_mm + t_a2a - t_both) / min(t_mm, t_a2a), clipped to [0, 1].
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
from collections.abc import Callable

from moe_overlap.skill.estimate_model import Calibration
from moe_overlap.verify.ranks import RanksFailed, run_ranks


class CalibrationFailed(RuntimeError):
    pass


def _timed(fn: Callable[[], object], sync: Callable[[], None], repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn`` (each run between two barriers)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _measure(rank: int, world: int, dtype_name: str, device_name: str, repeats: int, scale: float) -> dict:
    """Runs in each spawned rank."""
    import torch
    import torch.distributed as dist

    from moe_overlap.ep.experts import GroupedExperts

    device = torch.device(device_name)
    if device.type == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[dtype_name])
    esize = torch.empty((), dtype=dtype).element_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()

    torch.manual_seed(rank)
    out: dict = {}
    # Expert GEMMs: a mid-sized CPU shape (scaled up on GPU so the GPU is not launch-bound).
    d, f, local, rows = (int(512 * scale), int(512 * scale), 4, int(2048 * scale))
    experts = GroupedExperts(local, d, f, dtype=dtype, device=device)
    with torch.no_grad():
        experts.w1.normal_(0, 0.02)
        experts.w2.normal_(0, 0.02)
    x = torch.randn(rows, d, dtype=dtype, device=device, requires_grad=True)
    counts = [rows // local] * local
    gy = torch.randn(rows, d, dtype=dtype, device=device)

    def expert_step() -> None:
        experts.w1.grad = experts.w2.grad = x.grad = None
        experts(x, counts).backward(gy)

    out["expert_tflops"] = 18.0 * d * f * rows / _timed(expert_step, sync, repeats) / 1e12
    n = int(1024 * scale)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    out["dense_tflops"] = 2.0 * n**3 / _timed(lambda: a @ b, sync, repeats) / 1e12
    src = torch.randn(rows * 4, d, dtype=dtype, device=device)
    idx = torch.randperm(rows * 4, device=device)
    out["mem_gbps"] = 2.0 * src.numel() * esize / _timed(lambda: src.index_select(0, idx), sync, repeats) / 1e9

    small = torch.randn(world * 8, dtype=dtype, device=device)
    t_small = _timed(lambda: dist.all_to_all_single(torch.empty_like(small), small), sync, repeats)
    big = torch.randn(int(4 * 1024 * 1024 * scale) // esize * world // world, dtype=dtype, device=device)
    big = big[: big.numel() // world * world]
    t_big = _timed(lambda: dist.all_to_all_single(torch.empty_like(big), big), sync, repeats)
    off_rank = big.numel() * esize * (world - 1) / world
    out["a2a_latency_us"] = t_small * 1e6
    out["a2a_gbps"] = off_rank / max(t_big - t_small, 1e-9) / 1e9

    # Overlap: size the matmul loop to take about as long as the big all-to-all.
    t_mm1 = _timed(lambda: a @ b, sync, max(3, repeats // 2))
    iters = max(1, round(t_big / t_mm1))

    def mm_loop() -> None:
        for _ in range(iters):
            a @ b

    def both() -> None:
        work = dist.all_to_all_single(torch.empty_like(big), big, async_op=True)
        mm_loop()
        work.wait()

    t_mm = _timed(mm_loop, sync, repeats)
    t_both = _timed(both, sync, repeats)
    hidden = t_mm + t_big - t_both
    out["overlap_efficiency"] = min(1.0, max(0.0, hidden / min(t_mm, t_big)))
    out["raw"] = {"t_small_s": t_small, "t_big_s": t_big, "t_mm_s": t_mm, "t_both_s": t_both, "mm_iters": iters,
                  "expert_shape": [d, f, local, rows], "a2a_bytes": big.numel() * esize}
    return out


def calibrate(*, backend: str | None = None, world: int = 2, precision: str = "fp32", repeats: int = 7,
              timeout_s: float = 600.0) -> Calibration:
    """Spawn ``world`` ranks, measure, and return the slowest rank's numbers as a Calibration."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise CalibrationFailed("torch is not installed")
    cuda = backend == "nccl" or (backend is None and _cuda_available())
    backend = backend or ("nccl" if cuda else "gloo")
    device, scale = ("cuda", 8.0) if cuda else ("cpu", 1.0)
    try:
        per_rank = run_ranks(_measure, precision, device, repeats, scale, world=world, backend=backend,
                             timeout_s=timeout_s)
    except RanksFailed as exc:
        raise CalibrationFailed(str(exc)) from None
    return calibration_from(per_rank, backend=backend, world=world, precision=precision, repeats=repeats)


def calibration_from(per_rank: list[dict], *, backend: str, world: int, precision: str, repeats: int) -> Calibration:
    """Combine per-rank numbers: the slowest rank sets each rate (collectives wait for it)."""
    def slowest(key: str) -> float:
        return min(r[key] for r in per_rank)

    return Calibration(
        expert_tflops=slowest("expert_tflops"), dense_tflops=slowest("dense_tflops"), mem_gbps=slowest("mem_gbps"),
        a2a_gbps=slowest("a2a_gbps"), a2a_latency_us=max(r["a2a_latency_us"] for r in per_rank),
        overlap_efficiency=slowest("overlap_efficiency"),
        source=(f"moe_overlap.verify.calibrate: {backend}, {world} ranks, {precision}, median of {repeats}, "
                f"{platform.node()} ({platform.machine()}), {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%dT%H:%MZ}"),
    )


def _cuda_available() -> bool:
    import subprocess
    import sys

    # Asked in a child so this process never imports torch.
    probe = "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() >= 2 else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0
