"""MoELayer on CUDA: the expert GEMM path, and none/chunked over NCCL with a comm stream (2 GPUs).

Skipped without CUDA (tests/conftest.py); the 2-GPU test also needs two devices. fp32 runs with TF32
off so the float64 reference (refs.py) bounds the error at 1e-4 relative (GPU GEMMs reduce in another
order than the CPU); bf16 is checked against the fp32 CUDA run at bf16 tolerance.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

D, F, E, K = 64, 64, 8, 2


def _inputs(rank, tokens=24):
    g = torch.Generator().manual_seed(50 + rank)
    return torch.randn(tokens, D, generator=g) + 0.1 * rank, torch.randn(tokens, D, generator=g)


def _run(layer, x0, gout, schedule, chunks, stream):
    layer.zero_grad(set_to_none=True)
    x = x0.clone().requires_grad_()
    out, aux = layer(x, schedule=schedule, chunks=chunks, comm_stream=stream)
    ((out.float() * gout.float()).sum() + 0.01 * aux).backward()
    torch.cuda.synchronize()
    return {"out": out.detach().float().cpu(), "x": x.grad.float().cpu(),
            "router": layer.router.weight.grad.float().cpu(), "w1": layer.experts.w1.grad.float().cpu(),
            "w2": layer.experts.w2.grad.float().cpu()}


def _body(rank, world, group, dtype_name):
    from moe_overlap.ep.layer import MoELayer, init_full_weights, shard_full_weights
    from moe_overlap.ep.streams import make_comm_stream

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", torch.cuda.current_device())
    dtype = getattr(torch, dtype_name)
    layer = MoELayer(D, F, E, K, group, dtype=dtype, device=device)
    layer.load_state_dict(shard_full_weights(init_full_weights(D, F, E, seed=1), rank, world))
    x0, gout = (t.to(device, dtype) for t in _inputs(rank))
    stream = make_comm_stream(device)
    res = {s: _run(layer, x0, gout, s, c, stream) for s, c in (("none", 1), ("chunked", 3))}
    res["path"] = layer.expert_path(x0)
    return res


def _reference(world):
    from moe_overlap.ep.layer import init_full_weights
    from moe_overlap.ep.refs import reference_moe

    full = {n: w.double().requires_grad_() for n, w in init_full_weights(D, F, E, seed=1).items()}
    xs, gouts = zip(*[_inputs(r) for r in range(world)], strict=True)
    xs = [x.double().requires_grad_() for x in xs]
    outs, auxes, _ = reference_moe(xs, full, topk=K)
    (sum((o * g.double()).sum() for o, g in zip(outs, gouts, strict=True)) + 0.01 * sum(auxes)).backward()
    return {"out": torch.cat([o.detach() for o in outs]), "x": torch.cat([x.grad for x in xs]),
            "router": full["router.weight"].grad, "w1": full["experts.w1"].grad, "w2": full["experts.w2"].grad}


def _gather(per_rank, schedule):
    got = [r[schedule] for r in per_rank]
    return {"out": torch.cat([g["out"] for g in got]), "x": torch.cat([g["x"] for g in got]),
            "router": sum(g["router"] for g in got), "w1": torch.cat([g["w1"] for g in got]),
            "w2": torch.cat([g["w2"] for g in got])}


def _rel(a, b):
    return (a.double() - b.double()).abs().max().item() / max(b.abs().max().item(), 1e-6)


@pytest.mark.parametrize("world", [1, 2])
def test_layer_on_cuda_matches_reference(world):
    from tests.distributed._spawn import run_ranks

    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    want = _reference(world)
    fp32 = run_ranks(_body, world, args=("float32",), timeout=300, backend="nccl")
    bf16 = run_ranks(_body, world, args=("bfloat16",), timeout=300, backend="nccl")
    print("expert path fp32:", fp32[0]["path"], "bf16:", bf16[0]["path"])
    for schedule in ("none", "chunked"):
        got32, got16 = _gather(fp32, schedule), _gather(bf16, schedule)
        for key in want:
            assert _rel(got32[key], want[key]) <= 1e-4, (schedule, key, _rel(got32[key], want[key]))
            assert _rel(got16[key], got32[key]) <= 6e-2, (schedule, key, _rel(got16[key], got32[key]))
