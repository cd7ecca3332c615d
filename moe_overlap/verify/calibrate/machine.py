"""Measure this machine for the estimator: GEMM rate, activation and gather cost, all-to-all, overlap.

``calibrate()`` keeps the caller torch-free: it spawns ``world`` ranks (gloo on CPU, NCCL on CUDA) and each
rank times small probes built from our own implementation (``moe_overlap.ep``: GroupedExperts, route,
dispatch, combine; ``torch.distributed.all_to_all_single`` as ``ep.all_to_all`` calls it).

Probes run in rounds (every probe once per round, each between two barriers); a probe's time is the
median over rounds of the slowest rank's time (collectives finish together). Rounds interleave the probes
so that a machine shared with other jobs (the 2-core dev/CI boxes here) loads them alike; medians damp
that noise, they do not remove it. ``benchmarks/estimator/estimate_vs_measured.py`` interleaves these same probes
with its measured layers.

Derived numbers:
* dense_tflops: a square matmul. mem_gbps: a row gather (``index_select``), bytes read + written.
* all-to-all: latency + bytes leaving the rank / bandwidth, fitted over A2A_BYTES.
* overlap_efficiency: an async all-to-all beside a matmul loop of about its length:
  (t_mm + t_a2a - t_both) / min(t_mm, t_a2a), clipped to [0, 1].
* our layer's compute: MoELayer forward + backward on a group of one rank (no collective) at the
  LOCAL_SHAPES, fitted (least squares, coefficients >= 0) as fixed cost + GEMM FLOPs / rate + routed rows
  x D x gather cost + routed rows x F x activation cost + expert weights x weight-gradient write cost.
"""

from __future__ import annotations

import datetime as _dt
import platform
import statistics
import time
from collections.abc import Callable

from moe_overlap.skill.estimate.model import Calibration
from moe_overlap.verify.run.ranks import RanksFailed, run_ranks

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# (tokens, hidden, ffn, experts, topk) of the no-communication layer probes (CPU sizes; x scale on GPU
# for tokens only). Chosen apart from the benchmark's shapes: the fit is checked on shapes it never saw.
LOCAL_SHAPES = [(64, 64, 64, 4, 1), (256, 128, 128, 4, 2), (512, 512, 64, 4, 2), (256, 256, 512, 4, 2),
                (1024, 128, 256, 8, 1), (128, 512, 256, 4, 4), (64, 256, 512, 16, 1), (128, 512, 256, 8, 1)]
A2A_BYTES = [64, 1024 * 1024, 4 * 1024 * 1024, 16 * 1024 * 1024]
REPS = 5  # short probes (dense, gather, all-to-all) run this many times per round, averaged


class CalibrationFailed(RuntimeError):
    pass


class CalibrationUnavailable(CalibrationFailed):
    """The requested backend cannot run on this machine (bad input, found before any rank starts)."""


def make_probes(rank: int, world: int, precision: str, device_name: str, scale: float) -> tuple[dict, dict]:
    """Build the probes in a spawned rank: returns (name -> zero-arg callable, sizes for the maths)."""
    import torch
    import torch.distributed as dist

    from moe_overlap.ep.layer import MoELayer

    device = torch.device(device_name)
    dtype = getattr(torch, DTYPES[precision])
    esize = torch.empty((), dtype=dtype).element_size()
    torch.manual_seed(1234 + rank)
    sizes = {"rows": int(1024 * scale), "d": int(512 * scale), "mm_n": int(512 * scale), "esize": esize}
    probes: dict[str, Callable[[], object]] = {}

    # Our MoE layer on a group of one rank (no collective: the all-to-alls short-cut to the identity), at
    # several shapes: its compute cost per GEMM FLOP, per routed row per D and per F element, and fixed.
    singles = [dist.new_group([r]) for r in range(world)]  # every rank must create every group
    sizes["local_shapes"] = [(int(t * scale), d, f, e, k) for t, d, f, e, k in LOCAL_SHAPES]
    for i, (t, d, f, e, k) in enumerate(sizes["local_shapes"]):
        layer = MoELayer(d, f, e, k, singles[rank], force_balance=True, dtype=dtype, device=device, seed=i)
        x = torch.randn(t, d, dtype=dtype, device=device, requires_grad=True)
        gy = torch.randn(t, d, dtype=dtype, device=device)

        def run(layer=layer, x=x, gy=gy) -> None:
            layer.zero_grad(set_to_none=True)
            x.grad = None
            layer(x)[0].backward(gy)
        probes[f"local_{i}"] = run

    a = torch.randn(sizes["mm_n"], sizes["mm_n"], dtype=dtype, device=device)
    probes["dense"] = _repeat(lambda: a @ a, REPS)
    src = torch.randn(sizes["rows"] * 2, sizes["d"], dtype=dtype, device=device)
    idx = torch.randperm(src.shape[0], device=device)
    probes["gather"] = _repeat(lambda: src.index_select(0, idx), REPS)
    sizes["a2a_off_rank_bytes"] = []
    for j, nbytes in enumerate(A2A_BYTES):
        buf = torch.randn(max(world, int(nbytes * scale) // esize // world * world), dtype=dtype, device=device)
        sizes["a2a_off_rank_bytes"].append(buf.numel() * esize * (world - 1) / world)
        # Back to back, no barrier in between: includes the ranks' natural skew, as inside a layer.
        probes[f"a2a_{j}"] = _repeat(lambda buf=buf: dist.all_to_all_single(torch.empty_like(buf), buf), REPS)
    big = buf  # the largest one

    def mm_loop() -> None:
        for _ in range(sizes["mm_iters"]):
            a @ a

    def both() -> None:
        work = dist.all_to_all_single(torch.empty_like(big), big, async_op=True)
        mm_loop()
        work.wait()

    probes["mm_loop"], probes["both"] = mm_loop, both
    # Size the matmul loop to about one large all-to-all (measured once here, before the rounds).
    sizes["mm_iters"] = 1
    t_a2a = min(_time_once(probes[f"a2a_{len(A2A_BYTES) - 1}"], _sync(device)) for _ in range(3)) / REPS
    t_mm = min(_time_once(lambda: a @ a, _sync(device)) for _ in range(3))
    sizes["mm_iters"] = max(1, round(t_a2a / max(t_mm, 1e-9)))
    return probes, sizes


def _sync(device) -> Callable[[], None]:
    import torch
    import torch.distributed as dist

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
    return sync


def _time_once(fn: Callable[[], object], sync: Callable[[], None]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def _repeat(fn: Callable[[], object], reps: int) -> Callable[[], object]:
    """A short probe run ``reps`` times in a row; :func:`time_round` reports the time of one."""
    def run() -> None:
        for _ in range(reps):
            fn()
    run.reps = reps  # type: ignore[attr-defined]
    return run


def time_round(probes: dict, device_name: str) -> dict[str, float]:
    """One timed run of every probe (seconds per single call)."""
    import torch

    sync = _sync(torch.device(device_name))
    return {name: _time_once(fn, sync) / getattr(fn, "reps", 1) for name, fn in probes.items()}


def _calibration_rank(rank: int, world: int, precision: str, device_name: str, scale: float,
                      rounds: int) -> dict:
    import torch

    if device_name == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device_name = f"cuda:{torch.cuda.current_device()}"
    probes, sizes = make_probes(rank, world, precision, device_name, scale)
    time_round(probes, device_name)  # warm-up
    return {"sizes": sizes, "rounds": [time_round(probes, device_name) for _ in range(rounds)]}


def slowest_per_round(per_rank: list[dict], name: str) -> list[float]:
    """The slowest rank's time of probe ``name`` in each round."""
    rounds = zip(*(r["rounds"] for r in per_rank), strict=True)
    return [max(rank_round[name] for rank_round in rr) for rr in rounds]


def slowest_median(per_rank: list[dict], name: str, stat: str = "median") -> float:
    """Median (or min) over rounds of the slowest rank's time for probe ``name``."""
    per_round = slowest_per_round(per_rank, name)
    return statistics.median(per_round) if stat == "median" else min(per_round)


def fit_nonnegative(features: list[list[float]], targets: list[float]) -> list[float]:
    """Least squares with every coefficient >= 0 (drop the negative ones and refit; few unknowns)."""
    n = len(features[0])
    active = list(range(n))
    while True:
        scale = [max(abs(row[j]) for row in features) or 1.0 for j in active]
        cols = [[row[j] / sc for j, sc in zip(active, scale, strict=True)] for row in features]
        m = len(active)
        ata = [[sum(r[i] * r[j] for r in cols) for j in range(m)] + [sum(r[i] * t for r, t in zip(cols, targets, strict=True))]
               for i in range(m)]
        for i in range(m):  # Gauss-Jordan with partial pivoting on [A^T A | A^T b]
            piv = max(range(i, m), key=lambda r: abs(ata[r][i]))
            ata[i], ata[piv] = ata[piv], ata[i]
            if abs(ata[i][i]) < 1e-300:
                continue
            for r in range(m):
                if r != i:
                    fac = ata[r][i] / ata[i][i]
                    ata[r] = [a - fac * b for a, b in zip(ata[r], ata[i], strict=True)]
        coef = [ata[i][m] / ata[i][i] / scale[i] if abs(ata[i][i]) >= 1e-300 else 0.0 for i in range(m)]
        if all(c >= 0 for c in coef) or m == 1:
            out = [0.0] * n
            for j, c in zip(active, coef, strict=True):
                out[j] = max(c, 0.0)
            return out
        active = [j for j, c in zip(active, coef, strict=True) if c >= 0] or active[:1]


def _relative_fit(features: list[list[float]], targets: list[float]) -> list[float]:
    """Fit relative errors (each row divided by its target): a 1 ms probe counts as much as a 100 ms one."""
    return fit_nonnegative([[x / t for x in row] for row, t in zip(features, targets, strict=True)],
                           [1.0] * len(targets))


def calibration_from(per_rank: list[dict], *, backend: str, precision: str, stat: str = "median") -> Calibration:
    """``stat``: "median" (default) or "min" over rounds (the least disturbed run on a shared machine)."""
    s = per_rank[0]["sizes"]
    world, rounds = len(per_rank), len(per_rank[0]["rounds"])
    t = {name: slowest_median(per_rank, name, stat) for name in per_rank[0]["rounds"][0]}
    dense_tflops = 2.0 * s["mm_n"] ** 3 / t["dense"] / 1e12
    # Local layer (no comm), forward + backward: t = fixed + gemm_flops/rate + R*D*c_d + R*F*c_f
    # + W*c_w + router, R = T*K routed rows, gemm_flops = 18*D*F*R, W = E*3*D*F expert weights (the
    # weight-gradient GEMMs write all of them whatever the row count); the router GEMMs (6*T*D*E) go at
    # the dense rate.
    feats, targets = [], []
    for i, (tok, d, f, e, k) in enumerate(s.get("local_shapes", LOCAL_SHAPES)):
        rows = tok * k
        feats.append([1.0, 18.0 * d * f * rows, rows * d, rows * f, 3.0 * e * d * f])
        targets.append(t[f"local_{i}"] - 6.0 * tok * d * e / (dense_tflops * 1e12))
    fixed, sec_per_flop, c_d, c_f, c_w = _relative_fit(feats, targets)
    # All-to-all: t = latency + off-rank bytes / bandwidth, fitted over the sizes.
    sizes = s["a2a_off_rank_bytes"]
    a2a_t = [t[f"a2a_{j}"] for j in range(len(sizes))]
    latency, sec_per_byte = _relative_fit([[1.0, b] for b in sizes], a2a_t)
    big = t[f"a2a_{len(sizes) - 1}"]
    hidden = t["mm_loop"] + big - t["both"]
    unresolved = []
    if sec_per_flop <= 0:
        # Probes dominated by fixed host cost (a fast GPU, small shapes) leave the GEMM term at zero, which
        # would read as an infinite rate: use the dense matmul rate measured in the same run instead.
        sec_per_flop = 1.0 / (dense_tflops * 1e12)
        unresolved.append("expert GEMM rate not resolved by the fit (host-bound probes): dense matmul rate used")
    if sec_per_byte <= 0:
        # Same for an all-to-all time flat in the size: fall back to the largest probe's plain rate.
        sec_per_byte = big / sizes[-1]
        unresolved.append("all-to-all bandwidth not resolved by the fit: largest probe's bytes / time used")
    return Calibration(
        expert_tflops=1.0 / sec_per_flop / 1e12,
        dense_tflops=dense_tflops,
        mem_gbps=2.0 * s["rows"] * 2 * s["d"] * s["esize"] / t["gather"] / 1e9,
        perm_ns_per_elem=c_d * 1e9,
        act_ns_per_elem=c_f * 1e9,
        wgrad_ns_per_weight=c_w * 1e9,
        a2a_gbps=1.0 / sec_per_byte / 1e9,
        a2a_latency_us=latency * 1e6,
        overlap_efficiency=min(1.0, max(0.0, hidden / min(t["mm_loop"], big))),
        overhead_ms=fixed * 1e3,
        source=(f"moe_overlap.verify.calibrate.machine: {backend}, {world} ranks, {precision}, {stat} of {rounds} "
                f"interleaved rounds (slowest rank), {platform.node()} ({platform.machine()}), "
                f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%dT%H:%MZ}" + "".join(f"; {u}" for u in unresolved)),
    )


def calibrate(*, backend: str | None = None, world: int = 2, precision: str = "fp32", rounds: int = 7,
              timeout_s: float = 600.0) -> Calibration:
    """Spawn ``world`` ranks, run the probes, return the machine's numbers."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        raise CalibrationFailed("torch is not installed")
    if backend == "nccl" and not _cuda_available(world):
        raise CalibrationUnavailable(f"the nccl backend needs {world} visible CUDA GPUs; this machine has fewer")
    cuda = backend == "nccl" or (backend is None and _cuda_available(world))
    backend = backend or ("nccl" if cuda else "gloo")
    device, scale = ("cuda", 8.0) if cuda else ("cpu", 1.0)
    try:
        per_rank = run_ranks(_calibration_rank, precision, device, scale, rounds, world=world, backend=backend,
                             timeout_s=timeout_s)
    except RanksFailed as exc:
        raise CalibrationFailed(str(exc)) from None
    return calibration_from(per_rank, backend=backend, precision=precision)


def _cuda_available(world: int) -> bool:
    import subprocess
    import sys

    # Asked in a child so this process never imports torch.
    probe = f"import torch, sys; sys.exit(0 if torch.cuda.device_count() >= {world} else 1)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=120).returncode == 0
