"""The GPU-only paths of the all-to-all: copy engines over symmetric memory, the host counts group, and
an EP 1 layer with no host sync at all. Skipped without CUDA; the 2-rank tests also need two GPUs."""

from __future__ import annotations

import pytest
import torch

from tests.distributed._spawn import run_ranks

pytestmark = pytest.mark.gpu


def _marked(rank, world, d=40):
    """Rows sent by `rank`: (rank + q + 1) * 3 rows for rank q, each row holding (rank, q, row, noise)."""
    splits = [(rank + q + 1) * 3 for q in range(world)]
    rows = []
    for q, n in enumerate(splits):
        r = torch.randn(n, d)
        r[:, 0], r[:, 1], r[:, 2] = rank, q, torch.arange(n)
        rows.append(r)
    recv = [(s + rank + 1) * 3 for s in range(world)]
    return torch.cat(rows), splits, recv


def _ce_body(rank, world, group):
    import torch.distributed as dist

    from moe_overlap.ep.all_to_all import all_to_all_async
    from moe_overlap.ep.transport import CopyEngineTransport, make_transport

    device = torch.device("cuda", torch.cuda.current_device())
    out = {}
    if world == 1:  # the symmetric-memory mechanics (rendezvous, barriers, copy-out) on one GPU
        tr = CopyEngineTransport(group, device, max_rows=64, max_row_bytes=40 * 2)
        x = torch.randn(48, 40, device=device, dtype=torch.bfloat16)
        y, ev = tr.all_to_all(x, [48], [48], None)
        ev.synchronize()
        out["identity"] = bool(torch.equal(x, y))
        return out
    tr, why = make_transport("auto", group, device, max_rows=256, max_row_bytes=40 * 4)
    out["auto"] = why
    for dtype in (torch.float32, torch.bfloat16):
        for _ in range(3):  # back to back: the buffer is reused while earlier outputs are held
            x, send, recv = _marked(rank, world)
            x = x.to(device, dtype)
            want = torch.empty(sum(recv), 40, device=device, dtype=dtype)
            dist.all_to_all_single(want, x, recv, send, group=group)
            got = all_to_all_async(x, recv, send, group, transport=tr).wait()
            torch.cuda.synchronize()
            out.setdefault("equal", []).append(bool(torch.equal(got, want)))
    return out


@pytest.mark.parametrize("world", [1, 2])
def test_copy_engine_all_to_all_equals_nccl(world):
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    res = run_ranks(_ce_body, world, timeout=240, backend="nccl")
    for r in res:
        if world == 1:
            assert r["identity"]
        else:
            assert "copy engines" in r["auto"], r["auto"]
            assert all(r["equal"]), r["equal"]


def _layer_body(rank, world, group):
    """MoELayer none and the 1f1b pair: NCCL vs copy engines + host counts group, bit for bit."""
    import torch.distributed as dist

    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.ep.transport import make_transport

    device = torch.device("cuda", torch.cuda.current_device())
    layer = MoELayer(64, 32, 8, 2, group, dtype=torch.bfloat16, device=device, seed=3)
    tr, _ = make_transport("ce", group, device, max_rows=96 * 2, max_row_bytes=64 * 2)
    counts_group = dist.new_group(backend="gloo")
    g = torch.Generator().manual_seed(rank)
    x0 = torch.randn(96, 64, generator=g).to(device, torch.bfloat16)
    gout = torch.randn(96, 64, generator=g).to(device, torch.bfloat16)
    res = []
    for kw in ({}, {"transport": tr, "counts_group": counts_group}):
        layer.zero_grad(set_to_none=True)
        x = x0.clone().requires_grad_()
        out, _ = layer(x, **kw)
        out.backward(gout)
        res.append([t.float().cpu() for t in (out.detach(), x.grad, layer.experts.w1.grad, layer.router.weight.grad)])
    return [bool(torch.equal(a, b)) for a, b in zip(*res, strict=True)]


def test_layer_with_copy_engines_is_bitwise_nccl():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    for r in run_ranks(_layer_body, 2, timeout=240, backend="nccl"):
        assert all(r), r


def _nosync_body(rank, world, group):
    from moe_overlap.ep.layer import MoELayer

    device = torch.device("cuda", torch.cuda.current_device())
    layer = MoELayer(256, 128, 16, 4, group, force_balance=True, dtype=torch.bfloat16, device=device, seed=0)
    x = torch.randn(512, 256, device=device, dtype=torch.bfloat16, requires_grad=True)
    for schedule in ("none", "chunked", "none"):  # warm-up first: lazy inits may sync once
        out, _ = layer(x, schedule=schedule, chunks=2)
        out.backward(torch.ones_like(out))
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for schedule in ("none", "chunked"):
            out, _ = layer(x, schedule=schedule, chunks=2)
            out.backward(torch.ones_like(out))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    return "no host sync"


def test_ep1_layer_has_no_host_sync():
    assert run_ranks(_nosync_body, 1, timeout=240, backend="nccl") == ["no host sync"]

