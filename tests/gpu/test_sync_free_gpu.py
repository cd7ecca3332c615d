"""The sync-free EP path (ep/sync_free.py) on CUDA: no host sync (torch's sync debug mode set to raise), captured
in CUDA graphs with its NCCL all-to-alls inside, the graphed layer bitwise the eager one; at world 1 (the EP > 1
code path forced) and, with two GPUs, at EP 2 bitwise the default path."""

from __future__ import annotations

import pytest
import torch

from tests.distributed._spawn import run_ranks

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")


def _run(call, layer, x, g):
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out, aux = call(x)
    (out.float().mul(g.float()).sum() + aux).backward()
    return [out.detach().clone(), aux.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]


def _check(group, shape, rank=0, compare_default=False):
    from moe_overlap.ep.graphed import graph_layer
    from moe_overlap.ep.layer import MoELayer

    T, D, F, E, K = shape
    torch.manual_seed(0)
    layer = MoELayer(D, F, E, K, group, dtype=torch.bfloat16, device="cuda", seed=None)
    gen = torch.Generator(device="cuda").manual_seed(10 + rank)
    xs = [torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=gen) + rank for _ in range(3)]
    g = torch.randn(T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    eager = lambda v: layer(v, sync_free=True)  # noqa: E731
    want = [_run(eager, layer, x, g) for x in xs]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # a host sync inside the layer raises
    try:
        _run(eager, layer, xs[0], g)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    if compare_default:
        for a, b in zip(want[0], _run(layer, layer, xs[0], g), strict=True):
            assert torch.equal(a, b), "sync-free path differs from the default path"
    graphed = graph_layer(layer, xs[0].clone().requires_grad_(), sync_free=True)
    for x, ref in zip(xs, want, strict=True):
        for i, (a, b) in enumerate(zip(_run(graphed, layer, x, g), ref, strict=True)):
            assert torch.equal(a, b), f"tensor {i} of the graphed sync-free layer differs from the eager one"
    return True


@cuda
@pytest.mark.parametrize("shape", [(512, 256, 128, 16, 4), (4096, 2048, 768, 16, 8)])  # the second: Qwen3-30B-A3B
def test_forced_sync_free_path_at_world_1_is_sync_free_and_graphs_bitwise(shape):
    import torch.distributed as dist

    from moe_overlap.verify.run.ranks import free_port

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    assert _check(dist.group.WORLD, shape)


def _body(rank, world, group, shape):
    return _check(group, shape, rank, compare_default=True)


@cuda
@two_gpus
def test_sync_free_path_at_ep2_is_the_default_path_and_graphs_bitwise():
    assert all(run_ranks(_body, world=2, args=((512, 256, 128, 16, 4),), backend="nccl", timeout=300))


@cuda
@pytest.mark.parametrize("sync_free", [False, True])  # EP 1's own path, and the EP > 1 path forced at world 1
def test_graphed_experts_nodes_keep_the_bits_of_the_eager_nodes(sync_free):
    """forward_backward(graphs=ExpertGraphs()) over 3 steps of 3 micro-batches (two graphs per layer in use,
    replayed across steps) vs eager nodes: same losses and gradients, in none and 1f1b; delayed wgrad stays eager."""
    import torch.distributed as dist

    from moe_overlap.ep.model import ModelConfig, MoETransformer
    from moe_overlap.ep.node_graphs import ExpertGraphs
    from moe_overlap.ep.step import forward_backward
    from moe_overlap.verify.run.ranks import free_port

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    cfg = ModelConfig(vocab_size=128, hidden=256, ffn=128, num_heads=4, num_layers=2, num_experts=8, topk=2)
    gen = torch.Generator().manual_seed(0)
    steps = [[(t.cuda(), torch.roll(t, -1, 1).cuda()) for t in torch.randint(0, 128, (3, 2, 64), generator=gen)]
             for _ in range(3)]
    for schedule, delay in (("none", False), ("1f1b", False), ("1f1b", True)):
        out = []
        for graphs in (None, ExpertGraphs()):
            model = MoETransformer(cfg, dist.group.WORLD).cuda().to(torch.bfloat16)
            rows = []
            for batches in steps:
                res = forward_backward(model, batches, schedule=schedule, delay_wgrad=delay, group=dist.group.WORLD,
                                       sync_free=sync_free, graphs=graphs)
                rows.append((res.losses, [p.grad.clone() for p in model.parameters()]))
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(p.grad, alpha=-1e-2)
            out.append((rows, graphs.captured if graphs else 0))
        (eager, _), (graphed, captured) = out
        assert captured == (0 if delay else 2 * cfg.num_layers)
        for (l_e, g_e), (l_g, g_g) in zip(eager, graphed, strict=True):
            assert l_e == l_g, f"{schedule} delay={delay}: losses differ with graphed experts nodes"
            assert all(torch.equal(a, b) for a, b in zip(g_e, g_g, strict=True)), f"{schedule}: gradients differ"
