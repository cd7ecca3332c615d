"""Communication-stream helpers: real CUDA streams and events on GPU, no-ops on CPU.

On CPU, gloo's ``async_op=True`` already runs the collective on gloo's own thread, so there is no
stream to manage; every helper here accepts ``stream=None`` and does nothing then. On CUDA the
communication stream must (1) wait for the compute stream before reading its tensors, and
(2) be waited on by the compute stream before the result is read; tensors allocated on one
stream and used on the other are marked with ``record_stream`` so the caching allocator does not
hand their memory out again while the other stream still uses it.
"""

from __future__ import annotations

import torch


def make_comm_stream(device: torch.device | str) -> torch.cuda.Stream | None:
    """A new high-priority CUDA stream for collectives, or None on CPU.

    High priority: when a collective and a GEMM become ready together, the block scheduler hands free SMs
    to the collective's blocks first; a persistent GEMM that took every SM first would otherwise hold
    the collective back until it ends (no overlap at all). It does not preempt running blocks.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return torch.cuda.Stream(device=device, priority=-1)


def current_stream(device: torch.device) -> torch.cuda.Stream | None:
    return torch.cuda.current_stream(device) if device.type == "cuda" else None


def record_event(stream: torch.cuda.Stream | None) -> torch.cuda.Event | None:
    if stream is None:
        return None
    event = torch.cuda.Event()
    event.record(stream)
    return event


def wait_event(stream: torch.cuda.Stream | None, event: torch.cuda.Event | None) -> None:
    if stream is not None and event is not None:
        stream.wait_event(event)


def record_stream(tensor: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
    """Tell the caching allocator that ``tensor`` is used on ``stream`` (no-op on CPU)."""
    if stream is not None and tensor.is_cuda:
        tensor.record_stream(stream)


def synchronize(device: torch.device) -> None:
    """Device-wide barrier for timing (no-op on CPU, where ops are synchronous)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
