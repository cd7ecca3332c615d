"""Variable-split all-to-all: an async handle for schedules and an autograd function for the sync path.

Shape legend: N rows sent (sum of in_splits), M rows received (sum of out_splits), D trailing size.

Conventions (the order of ``torch.distributed.all_to_all_single``'s arguments):
    in_splits[r]  = rows of x sent to rank r       (x rows are grouped by destination rank)
    out_splits[r] = rows received from rank r      (the result rows are grouped by source rank)
Splits are Python ints on the host: gloo and NCCL both need them there, which is why the
dispatcher exchanges counts first (one device-to-host sync per layer, see dispatcher.py).

A group of size 1 short-cuts to the identity (no collective is launched).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .streams import current_stream, record_event, record_stream, wait_event


def group_size(group) -> int:
    """World size of ``group``; a single process (1) when group is None and no default group exists."""
    if group is None:
        return dist.get_world_size() if dist.is_initialized() else 1
    # ProcessGroup.size() directly: dist.get_world_size(group) re-checks the group's membership in
    # Python on every call (~10 us each, called several times per node: measured in the host profile).
    return group.size()


def _check_splits(x: torch.Tensor, out_splits, in_splits, world: int) -> tuple[list[int], list[int]]:
    out_splits, in_splits = [int(s) for s in out_splits], [int(s) for s in in_splits]
    if len(out_splits) != world or len(in_splits) != world:
        raise ValueError(f"splits must have one entry per rank ({world}); got out={out_splits} in={in_splits}")
    if sum(in_splits) != x.shape[0]:
        raise ValueError(f"in_splits={in_splits} sum to {sum(in_splits)} but x has {x.shape[0]} rows")
    return out_splits, in_splits


@dataclass
class A2AHandle:
    """An all-to-all in flight. ``wait()`` returns the received tensor, ready on the current stream."""

    out: torch.Tensor
    work: object | None = None
    event: object | None = None  # CUDA event recorded on the comm stream after the collective
    _done: bool = False

    def wait(self) -> torch.Tensor:
        if not self._done:
            if self.work is not None:
                self.work.wait()
            if self.event is not None:
                consumer = current_stream(self.out.device)
                wait_event(consumer, self.event)
                # ``out`` was allocated on the comm stream and is now read on the consumer stream.
                record_stream(self.out, consumer)
            self._done = True
        return self.out


def all_to_all_async(
    x: torch.Tensor, out_splits, in_splits, group, stream: torch.cuda.Stream | None = None,
    after: torch.cuda.Event | None = None, transport=None,
) -> A2AHandle:
    """Start ``all_to_all_single`` and return a handle. Never builds an autograd graph.

    CPU/gloo: ``async_op=True``; gloo's worker thread moves the data while this thread computes.
    CUDA with ``stream``: the collective is issued on ``stream`` after it waits for ``after`` (an event
    recorded on the compute stream once ``x`` was written), or, without one, for everything queued on the
    compute stream so far. ``after`` is what lets a schedule issue the collective *after* queuing unrelated
    compute (another micro-batch's GEMMs) and still have the two run side by side. ``wait()`` makes the
    compute stream wait on an event, not the host. ``transport``: a transport.py object (copy engines)
    used instead of NCCL for CUDA tensors; it issues on its own stream (``stream`` is then unused).
    """
    world = group_size(group)
    out_splits, in_splits = _check_splits(x, out_splits, in_splits, world)
    x = x.detach().contiguous()
    if world == 1:
        return A2AHandle(out=x, _done=True)
    if transport is not None and x.is_cuda:
        out, event = transport.all_to_all(x, out_splits, in_splits, after)
        return A2AHandle(out=out, event=event)
    if stream is None or not x.is_cuda:
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        work = dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=True)
        return A2AHandle(out=out, work=work)
    return _on_comm_stream(x, stream, after, lambda: x.new_empty((sum(out_splits),) + tuple(x.shape[1:])),
                           lambda out: dist.all_to_all_single(out, x, out_splits, in_splits, group=group))


def _on_comm_stream(x: torch.Tensor, stream: torch.cuda.Stream, after: torch.cuda.Event | None, alloc, issue
                    ) -> A2AHandle:
    """Issue one collective on the comm ``stream`` once ``after`` (an event recorded when ``x`` was written) or,
    without one, everything queued on the caller's stream so far is done; the device waits, never the host.
    ``alloc()`` makes the output on the comm stream (so its memory belongs to that stream's pool); ``issue(out)``
    queues the collective. The handle's event marks the end, for the consumer stream to wait on."""
    if after is not None:
        stream.wait_event(after)
    else:
        stream.wait_stream(current_stream(x.device))
    with torch.cuda.stream(stream):
        out = alloc()
        issue(out)
        event = record_event(stream)
    record_stream(x, stream)  # x is read on the comm stream; keep its memory until that is done
    return A2AHandle(out=out, event=event)


def all_to_all_sync(x: torch.Tensor, out_splits, in_splits, group, transport=None) -> torch.Tensor:
    """All-to-all without autograd, complete for the current stream on return (on CPU: for the host)."""
    return all_to_all_async(x, out_splits, in_splits, group, transport=transport).wait()


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, transport):
        ctx.splits = (list(out_splits), list(in_splits))
        ctx.group, ctx.transport = group, transport
        out = all_to_all_sync(x, out_splits, in_splits, group, transport)
        # A 1-rank group returns x itself; autograd needs a fresh tensor as the output.
        return out.clone() if out.data_ptr() == x.data_ptr() and out.numel() else out

    @staticmethod
    def backward(ctx, grad_out):
        out_splits, in_splits = ctx.splits
        # The gradient travels back along the same rows: the reverse all-to-all swaps the splits.
        return all_to_all_sync(grad_out, in_splits, out_splits, ctx.group, ctx.transport), None, None, None, None


def all_to_all(x: torch.Tensor, out_splits, in_splits, group, transport=None) -> torch.Tensor:
    """Synchronous all-to-all with autograd (backward = the reverse all-to-all)."""
    return _AllToAll.apply(x, list(out_splits), list(in_splits), group, transport)


# ---------------------------------------------------------------- static sizes (the sync-free path, sync_free.py)
def all_to_all_equal_async(x: torch.Tensor, group, stream: torch.cuda.Stream | None = None,
                           after: torch.cuda.Event | None = None) -> A2AHandle:
    """``all_to_all_single`` of R equal blocks (x's rows split R ways, no split lists): sizes known from the shape
    alone, so no count reaches the host and NCCL can run it inside a CUDA graph. Unlike the variable-split
    call it runs at world 1 too where a process group exists (the forced EP > 1 path at one rank keeps its
    collective); without one it is the identity. ``stream``/``after`` as in :func:`all_to_all_async`."""
    x = x.detach().contiguous()
    if group is None and not dist.is_initialized():
        return A2AHandle(out=x, _done=True)
    world = group_size(group)
    if x.shape[0] % world:
        raise ValueError(f"all_to_all_equal: {x.shape[0]} rows do not split into {world} equal blocks")
    if stream is None or not x.is_cuda:
        out = torch.empty_like(x)
        work = dist.all_to_all_single(out, x, group=group, async_op=True)
        return A2AHandle(out=out, work=work)
    return _on_comm_stream(x, stream, after, lambda: torch.empty_like(x),
                           lambda out: dist.all_to_all_single(out, x, group=group))


class _AllToAllEqual(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = all_to_all_equal_async(x, group).wait()
        return out.clone() if out.data_ptr() == x.data_ptr() and out.numel() else out

    @staticmethod
    def backward(ctx, grad_out):  # equal blocks: the reverse all-to-all is the same call
        return all_to_all_equal_async(grad_out, ctx.group).wait(), None


def all_to_all_equal(x: torch.Tensor, group) -> torch.Tensor:
    """Synchronous equal-block all-to-all with autograd."""
    return _AllToAllEqual.apply(x, group)
