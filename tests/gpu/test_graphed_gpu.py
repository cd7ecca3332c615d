"""A CUDA-graphed EP 1 layer (ep/graphed.py) computes the eager layer's bits, for new inputs too."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _eager(layer, x, g):
    layer.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_()
    out, aux = layer(x)
    (out.float().mul(g.float()).sum() + aux).backward()
    return [out.detach().clone(), aux.detach().clone(), x.grad.clone()] + [p.grad.clone() for p in layer.parameters()]


@cuda
@pytest.mark.parametrize("force_balance,z_loss,shape", [
    (True, 1e-3, (512, 256, 128, 16, 4)), (False, 1e-3, (512, 256, 128, 16, 4)),
    (True, 0.0, (4096, 2048, 768, 16, 8)),  # the Qwen3-30B-A3B expert shape of benchmarks/gpu/gpu_layer.py
])
def test_graphed_layer_is_bitwise_the_eager_layer(force_balance, z_loss, shape):
    import torch.distributed as dist

    from moe_overlap.ep.graphed import graph_layer
    from moe_overlap.ep.layer import MoELayer
    from moe_overlap.verify.run.ranks import free_port

    if not dist.is_initialized():
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                device_id=torch.device("cuda", 0))
    torch.manual_seed(0)
    T, D, F, E, K = shape
    layer = MoELayer(D, F, E, K, dist.group.WORLD, force_balance=force_balance, z_loss_coeff=z_loss,
                     dtype=torch.bfloat16, device="cuda")
    xs = [torch.randn(T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    g = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
    want = [_eager(layer, x, g) for x in xs]
    graphed = graph_layer(layer, xs[0].requires_grad_())
    for x, ref in zip(xs, want, strict=True):  # new inputs are copied into the graph's static buffer
        layer.zero_grad(set_to_none=True)
        xl = x.detach().clone().requires_grad_()
        out, aux = graphed(xl)
        (out.float().mul(g.float()).sum() + aux).backward()
        got = [out.detach().clone(), aux.detach().clone(), xl.grad.clone()] + [p.grad.clone()
                                                                              for p in layer.parameters()]
        for i, (a, b) in enumerate(zip(got, ref, strict=True)):
            assert torch.equal(a, b), f"tensor {i} differs from the eager layer"
