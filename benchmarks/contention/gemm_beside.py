#!/usr/bin/env python3
"""The expert GEMMs beside a kernel that already holds k SMs: what an in-flight SM-driven all-to-all costs them.

    python benchmarks/contention/gemm_beside.py --out $OUT/gemm_beside.json           # on the lent GPU (one call)
    python benchmarks/contention/gemm_beside.py --holders 8 16 --shapes qwen3-ep2     # fewer cases

Why: in a 1F1B layer pair an SM-driven all-to-all (NCCL, DeepEP) is often already running when the expert
GEMMs start. Its kernels hold a few SMs for their whole duration. The estimator (skill/estimate/costs.py) models
two effects of that, which this script measures on one GPU, without any all-to-all, so that neither is a guess:

* **margin 0** (the GEMMs' persistent grid sized to every SM): the GEMM blocks that find no free SM wait for
  one to finish its whole share of tiles, a second wave (ep/sm_margin.py);
* **margin m** (the grid sized to SMs - m, ep/sm_margin.py's carve-out): no second wave once m is large enough
  beside a holder of k blocks (m = k, 2k and more are tried: on an H200, k was not enough for most k, 2k always
  was; benchmarks/results/h200_2026-12-02_beside), and the GEMMs still share HBM and L2 with the holder if it
  moves bytes.

The holder is a Triton kernel of k blocks (512 threads each, the size of an NCCL channel's block) on a
high-priority stream (as ep/streams.py's comm stream), launched before the GEMMs and lasting longer than them:

* ``spin``: arithmetic in registers, no memory traffic: an all-to-all whose kernels wait on a slow link (NCCL's
  network transport: a few GB/s through host staging buffers);
* ``copy``: a device-to-device copy as fast as its k blocks go: an all-to-all over NVLink, whose kernels read the
  local send buffer and whose peer writes into the local receive buffer (HBM traffic of the same order).

Per shape (the same per-rank shapes and six GEMMs as gemm_rate.py): the GEMMs alone, alone under each margin,
and beside each holder at margins 0, k and 2k (and any --margins); slowdown = that median over the alone one (margin 0). GEMM
time is taken by CUDA events on the GEMM stream only; ``covered`` is the share of iterations in which the
holder was still running when the GEMMs ended (a holder that ended first would understate the cost).

``late``: the other order, the holder (one unit, about an all-to-all's length) issued a twelfth of the GEMMs'
time after they started, as an all-to-all launched while a GEMM runs: ``wait_ms`` is how much longer it took
than alone, the time it waited for an SM. At margin 0 a persistent GEMM's blocks keep every SM until their
tiles are done, whatever the holder stream's priority; at margin k the holder finds its SMs free.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks.gpu.ep_overlap import machine_info  # noqa: E402
from benchmarks.gpu.gemm_rate import SHAPES, flops, gemms_fn  # noqa: E402

MIN_ITERS = 10
THREADS = 512  # an NCCL channel's block (NCCL_NTHREADS default)


def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def spin(out_ptr, sm_ptr, n_iter, BLOCK: tl.constexpr):
        x = tl.full((BLOCK,), 1.0, tl.float32) + tl.program_id(0)
        for _ in range(n_iter):  # a dependent chain: no memory traffic, the block keeps its SM
            x = x * 0.999999 + 1e-6
        tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), x)
        smid = tl.inline_asm_elementwise("mov.u32 $0, %smid;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
        tl.store(sm_ptr + tl.program_id(0), smid)

    @triton.jit
    def copy(src_ptr, dst_ptr, n_chunks, reps, BLOCK: tl.constexpr):
        pid, progs = tl.program_id(0), tl.num_programs(0)
        for _ in range(reps):
            for c in range(pid, n_chunks, progs):  # persistent: k blocks walk the whole buffer
                offs = c * BLOCK + tl.arange(0, BLOCK)
                tl.store(dst_ptr + offs, tl.load(src_ptr + offs))

    return spin, copy


class Holder:
    """k blocks of ``kind`` on ``stream``, sized to last about ``ms`` milliseconds."""

    def __init__(self, kind: str, k: int, stream: torch.cuda.Stream, device: torch.device):
        self.kind, self.k, self.stream = kind, k, stream
        self.spin, self.copy_k = _kernels()
        self.out = torch.empty(k * THREADS, device=device, dtype=torch.float32)
        self.sms = torch.full((k,), -1, device=device, dtype=torch.int32)  # the SM each spin block ran on
        self.block = 4096  # elements of 4 bytes per chunk: 16 KiB
        self.src = torch.empty(256 * 2**20 // 4, device=device, dtype=torch.float32)  # 256 MiB
        self.dst = torch.empty_like(self.src)
        self.n_chunks = self.src.numel() // self.block
        self.units = 1
        self.unit_ms = self._time_unit()

    def _launch(self, units: int) -> None:
        if self.kind == "spin":
            self.spin[(self.k,)](self.out, self.sms, 20000 * units, BLOCK=THREADS, num_warps=THREADS // 32)
        else:
            self.copy_k[(self.k,)](self.src, self.dst, self.n_chunks, units, BLOCK=self.block,
                                   num_warps=THREADS // 32)

    def _time_unit(self) -> float:
        for _ in range(2):
            self._launch(1)
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ms = []
        for _ in range(5):
            a.record()
            self._launch(1)
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        return statistics.median(ms)

    def distinct_sms(self) -> int | None:
        """SMs the spin holder's k blocks ran on (its last launch)."""
        return None if self.kind != "spin" else int(torch.unique(self.sms).numel())

    def gbps(self) -> float | None:
        """Bytes read + written per second by the copy holder alone."""
        return None if self.kind == "spin" else 2 * self.src.numel() * 4 / (self.unit_ms * 1e-3) / 1e9

    def launch_for(self, ms: float) -> torch.cuda.Event:
        """Queue the holder on its stream for about `ms`; returns the event recorded when it ends."""
        end = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.stream):
            self._launch(max(1, round(ms / self.unit_ms)))
            end.record()
        return end


def time_gemms(fn, iters: int, margin: int, holder: Holder | None, holder_ms: float, device: torch.device,
               pad: Holder | None) -> dict:
    """Median ms of `fn` on the current stream (under `margin`), each iteration beside a fresh holder if given.

    Without a holder, `pad` (a 2-block spin; None: --no-pad) runs after the GEMMs for as long as a holder would have outlived
    them: the GPU's duty cycle is the same in every case. It matters: GEMMs back to back hold an H200 at its
    power limit (about 1.5 GHz here) while a GEMM phase followed by a light one runs at higher clocks, so an
    unpadded alone baseline made the same GEMMs beside a holder at a sufficient margin x0.82-0.96 of it."""
    from moe_overlap.ep.sm_margin import gemm_sm_margin

    ms, covered = [], 0
    with gemm_sm_margin(margin, device):
        for i in range(iters + 2):  # two warm-up iterations
            torch.cuda.synchronize()
            end_h = holder.launch_for(holder_ms) if holder else None
            # ~0.1 ms, alone too: the holder's blocks are resident before the GEMMs start, and the host has queued
            # the GEMMs before the GPU reaches them (without it, alone would include launch gaps, beside not)
            torch.cuda._sleep(200_000)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            if holder is None and holder_ms > 0 and pad is not None:
                pad._launch(max(1, round(holder_ms / pad.unit_ms)))
            torch.cuda.synchronize()
            if i >= 2:
                ms.append(a.elapsed_time(b))
                covered += bool(end_h is None or b.elapsed_time(end_h) > 0)
    return {"median_ms": round(statistics.median(ms), 4), "min_ms": round(min(ms), 4),
            "covered": round(covered / iters, 3)}


def _sleep_cycles_per_ms() -> float:
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1_000_000)
    a.record()
    torch.cuda._sleep(10_000_000)
    b.record()
    b.synchronize()
    return 10_000_000 / a.elapsed_time(b)


def time_late(fn, iters: int, margin: int, holder: Holder, lag_ms: float, cycles_per_ms: float,
              device: torch.device) -> dict:
    """The holder issued `lag_ms` after the GEMMs started (an all-to-all launched mid-GEMM): median of how much
    longer it took than alone (its wait for an SM), and the GEMMs' median."""
    from moe_overlap.ep.sm_margin import gemm_sm_margin

    waits, gemm = [], []
    with gemm_sm_margin(margin, device):
        for i in range(iters + 2):
            torch.cuda.synchronize()
            issued, done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(holder.stream):  # one thread sleeps, then the holder is queued
                torch.cuda._sleep(int(lag_ms * cycles_per_ms))
                issued.record()
                holder._launch(1)
                done.record()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            if i >= 2:
                waits.append(issued.elapsed_time(done) - holder.unit_ms)
                gemm.append(a.elapsed_time(b))
    return {"wait_ms": round(statistics.median(waits), 4), "gemm_ms": round(statistics.median(gemm), 4),
            "holder_alone_ms": round(holder.unit_ms, 4), "lag_ms": round(lag_ms, 4)}


def margins_for(k: int, extra: list[int]) -> list[int]:
    """The margins tried beside a holder of k blocks: 0 (second wave), k, 2k and any extra ones."""
    return sorted({0, k, 2 * k, *extra})


def measure(shape: dict, holders: list[int], kinds: list[str], iters: int, device: torch.device,
            stream: torch.cuda.Stream, cache: dict, extra: list[int], padded: bool = True) -> dict:
    fn, _ = gemms_fn(shape, str(device))
    pad = cache.get(("spin", 2)) or cache.setdefault(("spin", 2), Holder("spin", 2, stream, device))
    pad = pad if padded else None
    first = time_gemms(fn, 2, 0, None, 0.0, device, pad)["median_ms"]  # sizes the pad and the holders
    alone = time_gemms(fn, iters, 0, None, 2.0 * first + 1.0, device, pad)
    out = {"shape": shape, "flops": flops(shape), "alone": alone, "margin_alone": {}, "beside": {}}
    base = alone["median_ms"]
    for margin in sorted({m for k in holders for m in margins_for(k, extra)} - {0}):
        m = time_gemms(fn, iters, margin, None, 2.0 * first + 1.0, device, pad)
        out["margin_alone"][str(margin)] = dict(m, slowdown=round(m["median_ms"] / base, 4))
    for k in holders:
        for kind in kinds:
            h = cache.get((kind, k)) or cache.setdefault((kind, k), Holder(kind, k, stream, device))
            row = {"holder_gbps_alone": None if h.gbps() is None else round(h.gbps(), 1)}
            for margin in margins_for(k, extra):
                t = time_gemms(fn, iters, margin, h, 3.0 * first + 1.0, device, pad)
                row[f"margin_{margin}"] = dict(t, slowdown=round(t["median_ms"] / base, 4))
                # issued a twelfth of the GEMMs' time in: inside the first of the six, as an all-to-all
                # launched while a GEMM runs
                row[f"late_margin_{margin}"] = time_late(fn, iters, margin, h, first / 12, cache["cycles"], device)
            row["holder_sms"] = h.distinct_sms()
            out["beside"][f"{kind}-{k}"] = row
    out["alone_repeat_ms"] = time_gemms(fn, iters, 0, None, 2.0 * first + 1.0, device, pad)["median_ms"]
    return out


def summary(res: dict) -> dict:
    """What the docs quote, recomputed from a results file: per case, the range over every shape of the GEMMs'
    slowdown (and of the late holder's wait, ms)."""
    cases: dict[str, list[float]] = {}

    def add(key: str, v: float) -> None:
        cases.setdefault(key, []).append(v)

    for r in res["shapes"].values():
        for name, row in r["beside"].items():
            kind, k = name.split("-")
            add(f"margin 0 beside {kind}", row["margin_0"]["slowdown"])
            add(f"margin k beside {kind}-{k}", row[f"margin_{k}"]["slowdown"])
            add(f"margin 2k beside {kind}, over margin 2k alone", row[f"margin_{2 * int(k)}"]["median_ms"]
                / r["margin_alone"][str(2 * int(k))]["median_ms"])
            add(f"late wait ms, margin 0, {kind}", row["late_margin_0"]["wait_ms"])
            if kind == "spin":
                add("late wait ms, margin 2k, spin", row[f"late_margin_{2 * int(k)}"]["wait_ms"])
            if row["holder_gbps_alone"] is not None:
                add("copy holder GB/s alone (read + write)", row["holder_gbps_alone"])
            spin = r["beside"].get(f"spin-{k}")
            if kind == "copy" and spin:
                add("copy over spin at margin 2k", row[f"margin_{2 * int(k)}"]["median_ms"]
                    / spin[f"margin_{2 * int(k)}"]["median_ms"])
        for m, row in r["margin_alone"].items():
            add(f"margin {m} alone", row["slowdown"])
    return {key: (round(min(v), 3), round(max(v), 3)) for key, v in sorted(cases.items())}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), help=f"names from gemm_rate.py: {', '.join(SHAPES)}")
    ap.add_argument("--holders", type=int, nargs="+", default=[8, 16, 32], help="SMs the holder kernel takes")
    ap.add_argument("--margins", type=int, nargs="*", default=[],
                    help="margins tried beside every holder besides 0, k and 2k")
    ap.add_argument("--kinds", nargs="+", default=["spin", "copy"], choices=("spin", "copy"))
    ap.add_argument("--iters", type=int, default=20, help=f"timed iterations per case, median (>= {MIN_ITERS})")
    ap.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    ap.add_argument("--no-pad", action="store_true",
                    help="no pad after the GEMMs of the alone cases (shows the duty-cycle bias time_gemms describes)")
    ap.add_argument("--summary", type=Path, default=None, metavar="FILE",
                    help="print the ranges the docs quote from a results FILE and exit (no GPU needed)")
    a = ap.parse_args(argv)
    if a.summary:
        try:
            res = json.loads(a.summary.read_text(encoding="utf-8"))
            rows = summary(res)
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: --summary {a.summary}: not a gemm_beside.py results file ({exc})", file=sys.stderr)
            return 2
        for key, (lo, hi) in rows.items():
            print(f"{key}: {lo:g}-{hi:g}")
        return 0
    unknown = [n for n in a.shapes if n not in SHAPES]
    if unknown:
        print(f"error: --shapes: unknown {', '.join(unknown)}; choose from {', '.join(SHAPES)}", file=sys.stderr)
        return 2
    if a.iters < MIN_ITERS or any(k <= 0 for k in a.holders):
        print(f"error: --iters must be >= {MIN_ITERS} and each --holders value > 0", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU (Triton holders, the GEMMs' SM carve-out): run it on the GPU machine",
              file=sys.stderr)
        return 2
    from moe_overlap.ep.sm_margin import available

    device = torch.device("cuda")
    props = torch.cuda.get_device_properties(0)
    machine = dict(machine_info("cuda"), gpu=torch.cuda.get_device_name(), sm_count=props.multi_processor_count)
    res = {"command": "python " + " ".join(["benchmarks/contention/gemm_beside.py", *(argv if argv is not None else sys.argv[1:])]),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "machine": machine,
           "versions": {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda},
           "sm_carveout": available(), "padded": not a.no_pad, "timing": "CUDA events around the six GEMMs on their stream, median",
           "shapes": {}}
    stream = torch.cuda.Stream(device=device, priority=-1)  # as ep/streams.py's comm stream
    cache: dict = {"cycles": _sleep_cycles_per_ms()}
    for name in a.shapes:
        r = res["shapes"][name] = measure(SHAPES[name], a.holders, a.kinds, a.iters, device, stream, cache, a.margins,
                                           padded=not a.no_pad)
        print(f"[{name}] alone {r['alone']['median_ms']:.3f} ms; " + "; ".join(
            f"{h} on {v['holder_sms']} SMs: " + ", ".join(
                f"m{key[7:]} x{x['slowdown']:.2f} (late wait {v['late_' + key]['wait_ms']:.2f})"
                for key, x in v.items() if key.startswith("margin_")) for h, v in r["beside"].items()),
            file=sys.stderr, flush=True)
        torch.cuda.empty_cache()
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
