"""SMs the expert GEMMs leave free for the communication kernels that run beside them.

Why: torch's grouped GEMM (CUTLASS, sm90) is *persistent*: it launches one block per SM and each block
loops over tiles. When an all-to-all kernel (NCCL: one block per channel) already holds a few SMs, the
GEMM's last blocks wait for an SM, so the GEMM runs in two waves and takes up to twice as long; the
overlap then hides the all-to-all at the GEMM's expense. Measured on two H200s over an emulated
inter-node link (benchmarks/results/h200x2_2026-11-29_r5, ``profile_layer.py --fabric emulated-net``):
the grouped-GEMM kernels of a 1F1B layer pair took 16.2 ms against 10.8 ms in the sequential order.
PyTorch's SM carve-out (``torch._C._set_sm_carveout_experimental``; read by ``torch._grouped_mm``'s
CUTLASS path and by cuBLASLt as ``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``) sizes the GEMM's grid to
``SMs - margin`` instead, so it fits beside the communication kernel in one wave. It needs about twice the SMs
that kernel holds: on one H200 beside a stand-in kernel of k blocks, a margin of k left the second wave for
k = 2, 4 and 16, a margin of 2k never did (benchmarks/contention/gemm_beside.py,
benchmarks/results/h200_2026-12-02_beside/).

The margin is a process-wide setting in torch, so it is applied only around the expert nodes that run
while an all-to-all is in flight (schedule_1f1b.layer_pair) and restored afterwards; the sequential
schedules never set it. Copy-engine all-to-alls (transport.py) use no SMs and need no margin.

Results: the tile a block computes and its reduction order do not depend on how many blocks the
persistent grid has, so the grouped GEMMs' results are bitwise the same with any margin
(tests/gpu/test_sm_margin_gpu.py checks it).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


def available() -> bool:
    """Whether this torch build exposes the SM carve-out (torch >= 2.6 on CUDA)."""
    return hasattr(torch._C, "_set_sm_carveout_experimental") and hasattr(torch._C, "_get_sm_carveout_experimental")


def check_margin(margin: int, device: torch.device | None = None) -> int:
    """``margin`` as an int in [0, SMs of ``device``); ValueError naming the field and the range otherwise."""
    if isinstance(margin, bool) or not isinstance(margin, int) or margin < 0:
        raise ValueError(f"sm_margin={margin!r}: must be an int >= 0 (SMs the expert GEMMs leave to the "
                         "all-to-all kernels during overlap; 0 = off)")
    if device is not None and device.type == "cuda" and margin:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        if margin >= sms:
            raise ValueError(f"sm_margin={margin}: must be below the {sms} SMs of {torch.cuda.get_device_name(device)}")
    return margin


@contextmanager
def gemm_sm_margin(margin: int, device: torch.device | None):
    """Inside the block the GEMMs target ``SMs - margin`` SMs; 0, a CPU device or a torch without the
    carve-out leave everything as it is. The previous setting is restored on exit (even on error)."""
    if not margin or device is None or device.type != "cuda" or not available():
        yield
        return
    previous = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(margin)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(previous)


# SMs left to NCCL over a network transport: its all-to-all kernel held 2 blocks over the emulated inter-node
# link (NCCL 2.28.9, socket transport; profile_layer.py's nccl_blocks), and margins of 8 and 16 measured alike
# there, 32 slower (benchmarks/results/h200x2_2026-11-29_r5). 8 is above twice those 2 blocks (what a margin
# needs, module docstring) and leaves room for a few more channels per peer.
NETWORK_MARGIN = 8


def resolve_margin(requested: int | str, *, device: torch.device, nccl_all_to_all: bool, network: bool,
                   world: int) -> tuple[int, str]:
    """The margin a run uses and why. ``requested``: an int, or "auto":

    * a network link (ranks on several hosts, or the emulated one) with NCCL's all-to-all: NETWORK_MARGIN;
    * NCCL over NVLink: 0. Its kernel holds many more SMs there, and leaving 8-32 of them measured no better
      than 0 at the three EP 2 shapes (docs/benchmarks.md, fifth round);
    * copy engines: 0. Their only kernels are two one-block barriers per all-to-all; margins of 2 and 8
      measured no better (same section);
    * CPU ranks and EP 1 (no all-to-all): 0.
    """
    if requested != "auto":
        margin = check_margin(requested, device)
        return margin, f"{margin} (asked)"
    if device.type != "cuda" or world == 1:
        return 0, "0 (auto: no SM-driven all-to-all here)"
    if not nccl_all_to_all:
        return 0, "0 (auto: copy-engine all-to-alls; a margin measured no better)"
    if network:
        return NETWORK_MARGIN, f"{NETWORK_MARGIN} (auto: NCCL over a network link holds a few SMs beside the GEMMs)"
    return 0, "0 (auto: NCCL over NVLink; a margin measured no better)"
