"""The baseline's all-to-all transport: the faster of the candidates, timed in the ranks before training.

Why: the baseline stands for the run a user makes with overlap off, and that run takes the fastest all-to-all
it has. Copy engines overlap better beside the expert GEMMs (they take no SM) but are slower alone than NCCL
at some shapes (the Qwen3-30B-A3B shape on two H200s: `none` 6.53 vs 5.99 ms in one call,
benchmarks/results/h200x2_2026-11-29_r3/ep_overlap_cuda_r2_{ce,nccl}_run3.json); a baseline over the overlap's
transport would then be slowed, and every ratio against it flattered. So with ``--a2a auto`` the overlap modes
keep the transport auto picks, and the baseline takes whichever candidate moved the run's dispatch fastest.

The timing: an all-to-all of the run's largest dispatch (every routed row of a micro-batch, split evenly over
the ranks), a few warm-up calls, then the median of ``iters`` calls, each the slowest rank's (a MAX all-reduce
over the host group): every rank gets the same numbers and makes the same choice without another collective.

On CPU ranks there is one transport (gloo); tests fake two with :class:`DelayedTransport` (gloo plus a fixed
delay), named by ``FAKE_ENV`` (``"nccl=0,ce=0.02"``: seconds added per call), so the choice is observable.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.distributed as dist

FAKE_ENV = "MOE_OVERLAP_FAKE_A2A"


class DelayedTransport:
    """Test double of a transport on CPU ranks: gloo's all-to-all, then ``delay_s`` of sleep."""

    def __init__(self, name: str, group, delay_s: float) -> None:
        self.name, self.group, self.delay_s = name, group, delay_s

    def all_to_all(self, x: torch.Tensor, out_splits, in_splits, after=None):
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(out_splits), list(in_splits), group=self.group)
        time.sleep(self.delay_s)
        return out, None


def fake_candidates(group, text: str | None = None) -> dict[str, DelayedTransport] | None:
    """``{"nccl": ..., "ce": ...}`` from FAKE_ENV (CPU tests only); None when it is not set."""
    text = os.environ.get(FAKE_ENV) if text is None else text
    if not text:
        return None
    out = {}
    for part in text.split(","):
        name, _, delay = part.partition("=")
        out[name.strip()] = DelayedTransport(name.strip(), group, float(delay or 0))
    return out


def _one_call(transport, x: torch.Tensor, splits: list[int], group) -> None:
    if transport is None:
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, splits, splits, group=group)
    else:
        _out, event = transport.all_to_all(x, splits, splits, None)
        if event is not None:
            torch.cuda.current_stream(x.device).wait_event(event)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)


def time_all_to_all(transport, group, sync_group, device: torch.device, *, rows: int, hidden: int,
                    dtype: torch.dtype, warmup: int = 2, iters: int = 5) -> float:
    """Median seconds of one all-to-all of ``rows`` x ``hidden`` (split evenly), the slowest rank's per call."""
    world = dist.get_world_size(group)
    per = max(1, rows // world)
    x = torch.randn(per * world, hidden, device=device).to(dtype)
    splits = [per] * world
    for _ in range(warmup):
        _one_call(transport, x, splits, group)
    times = []
    for _ in range(iters):
        dist.barrier(sync_group)
        t0 = time.perf_counter()
        _one_call(transport, x, splits, group)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=sync_group)
        times.append(float(t.item()))
    return statistics.median(times)


def choose_baseline(candidates: dict[str, object], group, sync_group, device: torch.device, *, rows: int,
                    hidden: int, dtype: torch.dtype, iters: int = 5) -> tuple[str, object, dict[str, float]]:
    """(name, transport, {name: median ms}) of the fastest candidate; ties go to the first named. Collective:
    every rank calls it with the same candidates in the same order."""
    times_ms = {name: 1e3 * time_all_to_all(t, group, sync_group, device, rows=rows, hidden=hidden, dtype=dtype,
                                            iters=iters)
                for name, t in candidates.items()}
    best = min(times_ms, key=lambda n: (times_ms[n], list(candidates).index(n)))
    return best, candidates[best], {k: round(v, 4) for k, v in times_ms.items()}


def baseline_setup(cfg, a2a: str | None, sync_free: bool, group, device: torch.device, world: int, counts_group,
                   transport, note: str):
    """(the baseline's transport, the overlap modes' transport, the overlap's note, the baseline's note, the
    timed ms or None). With --a2a auto and a copy-engine transport the baseline takes the faster of it and NCCL
    (timed here); otherwise every mode shares the overlap's. On CPU ranks FAKE_ENV names two fakes (tests)."""
    from moe_overlap.verify.run.train import DTYPES

    fakes = fake_candidates(group) if device.type == "cpu" and world > 1 else None
    if fakes is not None:  # the overlap modes take "ce", as auto does on one host with peer access
        if "ce" in fakes:
            transport = fakes["ce"]
            note = f"auto: fake ce (gloo + {fakes['ce'].delay_s * 1e3:g} ms per call; a test's)"
        candidates = fakes
    elif world > 1 and not sync_free and a2a == "auto" and transport is not None:
        candidates = {"nccl": None, "ce": transport}
    else:
        why = ("--a2a auto found no copy-engine path" if a2a == "auto" and world > 1 and not sync_free
               else "--a2a auto times NCCL and copy engines for it" if world > 1 else "EP 1: no all-to-all")
        return transport, transport, note, f"the overlap modes' ({why})", None
    name, chosen, times = choose_baseline(candidates, group, counts_group or group, device,
                                          rows=cfg.micro_batch_size * cfg.seq_length * cfg.moe_router_topk,
                                          hidden=cfg.hidden_size, dtype=DTYPES[cfg.precision])
    shown = ", ".join(f"{k} {v:.3f} ms" for k, v in times.items())
    return chosen, transport, note, f"{name}: the faster alone at the run's dispatch ({shown})", times
