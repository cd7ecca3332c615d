"""A CUDA-graphed MoE layer (EP 1, or EP > 1 on the sync-free path): forward and backward replayed from two graphs.

Why: at small expert shapes the layer is host-bound. At the Qwen3-30B-A3B shape on one H200 the GPU
is busy 53-75 % of a forward+backward (benchmarks/gpu/gpu_layer.py): the host issues about 350 ops
(benchmarks/gpu/host_ops.py) in about as long as the GPU runs them, so the time beyond the expert GEMMs moves
with the host's speed, not with the kernels. A replayed graph issues them all in one launch.

What can be captured: every op of the layer at EP 1 on CUDA stays on the device. The token counts
never come to the host (counts.local_plan keeps them as a device tensor, the grouped GEMMs take device
offsets; tests/gpu/test_transport_gpu.py::test_ep1_layer_has_no_host_sync). At EP > 1 on the default path
the all-to-all's splits are host ints read from the count exchange, a host sync that a graph cannot hold, so
:func:`graph_layer` refuses it. With ``sync_free=True`` (ep/sync_free.py) the counts are exchanged and the rows
moved by equal-block NCCL all-to-alls, sizes known from the shapes alone, so the whole layer, collectives
included, is captured at any EP size (and at world 1 with a process group, the same code path forced, for
one-GPU measurements). Refused: gloo (its collectives run on the host), CPU inputs, copy engines (host splits).

Contract: the graphed callable takes an input of ``sample_x``'s shape, dtype and device and returns
``(out, aux_loss)`` like ``MoELayer.forward(x)`` with the default options (schedule ``none``); gradients
reach ``x`` and the layer's parameters through autograd as usual (accumulated into ``.grad``).
The outputs live in the graph's static buffers: the next replay overwrites them, so read or clone them
before calling again. Results are bitwise those of the eager layer (the same kernels on the same data;
tests/gpu/test_graphed_gpu.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class _LayerCall(nn.Module):
    """``x -> (out, aux_loss)`` of the wrapped layer: the module form ``make_graphed_callables`` takes
    (its parameters are the layer's, so their gradients flow through the backward graph)."""

    def __init__(self, layer: nn.Module, sync_free: bool = False, capacity: int | None = None) -> None:
        super().__init__()
        self.layer, self.sync_free, self.capacity = layer, sync_free, capacity

    def forward(self, x: torch.Tensor):
        if not self.sync_free:
            return self.layer(x)
        return self.layer(x, sync_free=True, capacity=self.capacity)


def check_graphable(layer, sample_x: torch.Tensor, *, sync_free: bool = False) -> None:
    """ValueError naming what keeps ``layer`` from being captured with inputs like ``sample_x``."""
    if getattr(layer, "ep_size", 1) != 1 and not sync_free:
        raise ValueError(f"graph_layer: the layer is expert-parallel over {layer.ep_size} ranks; on the default path "
                         "the all-to-all's splits come to the host (the token counts), which a CUDA graph cannot hold. "
                         "Pass sync_free=True (ep/sync_free.py: counts and splits on the device), or graph an EP 1 layer")
    group = getattr(layer, "group", None)
    if sync_free and dist.is_initialized():
        backend = dist.get_backend(group)
        if backend != "nccl":
            raise ValueError(f"graph_layer: the layer's group has backend {backend!r}; its collectives run on the "
                             "host, outside any CUDA graph. Build the layer over an NCCL group to capture it")
    if sample_x.device.type != "cuda" or not torch.cuda.is_available():
        raise ValueError(f"graph_layer: sample_x is on {sample_x.device}; CUDA graphs need a CUDA device "
                         "(run the layer eagerly on CPU)")
    w = next(layer.parameters())
    if w.device != sample_x.device:
        raise ValueError(f"graph_layer: sample_x is on {sample_x.device}, the layer on {w.device}")


def graph_layer(layer, sample_x: torch.Tensor, *, warmup_iters: int = 3, sync_free: bool = False,
                capacity: int | None = None):
    """Capture ``layer``'s forward and backward for inputs like ``sample_x`` [T, D]; returns the callable.

    The capture runs ``warmup_iters`` eager iterations on a side stream first (Triton autotuning and the
    allocator settle there, outside the graph). Their backward passes, like the captured one, go through
    ``torch.autograd.grad``, so the parameters' ``.grad`` is left as it was. ``sync_free``/``capacity``: the layer's
    sync-free path (required at EP > 1; every rank captures and replays together, the collectives pair up).
    """
    check_graphable(layer, sample_x, sync_free=sync_free)
    x = sample_x.detach().clone().requires_grad_(sample_x.requires_grad)
    return torch.cuda.make_graphed_callables(_LayerCall(layer, sync_free, capacity), (x,),
                                             num_warmup_iters=warmup_iters)
