"""All-to-all transports beside NCCL: device copies into peer memory (copy engines), for one host.

Shape legend: N rows sent, M rows received, D row width (elements), R ranks, C slot capacity (rows).

Why: on NVLink an NCCL all-to-all is a kernel; its blocks compete with the expert GEMMs for SMs, so the
two overlap poorly. A ``cudaMemcpyAsync`` between GPUs of one host runs on the copy engines instead and
leaves every SM to the GEMMs: on two H200s the 1f1b layer pair hid 0.56 of the shorter piece with NCCL and
0.89 with this transport at the DSv3-proxy shape (benchmarks/results/h200x2_2026-11-29/ep_overlap_cuda_r2.json
and ep_overlap_cuda_r2_ce.json).

``CopyEngineTransport`` (``torch.distributed._symmetric_memory``): every rank owns a symmetric buffer of
R slots of C rows; slot s of rank q receives what rank s sends to q. One all-to-all, on the comm stream:

    wait for the producer's event
    barrier(0)        every rank's buffer is free (its previous copy-out ran before, in stream order)
    copies            rows for peer q -> q's buffer, slot <my rank> (peer copy: copy engine, NVLink);
                      my own rows -> my output directly
    barrier(1)        every copy into my buffer has landed
    copy-out          slot s -> my output at s's offset (local copy engine), in source-rank order

so the output is byte for byte what ``all_to_all_single`` returns (tests compare the two). The barriers
are small kernels (one block); the copies use no SM. The buffer is copied out at once so that the next
all-to-all may reuse it while the caller still holds this one's output.

Capacity: a rank never sends more rows to one peer than it has rows, so C = the largest N of any call
(``max_rows``) makes every call fit; a call over it raises (all ranks alike: they check the same counts).
NVLink multicast is never used (``TORCH_SYMM_MEM_DISABLE_MULTICAST=1`` on the lent machines).

``make_transport("auto" | "nccl" | "ce", group, device)`` picks: ``auto`` takes copy engines when every
rank of the group is on this host, on CUDA, with peer access to every other rank's GPU, and NCCL (None)
otherwise; it is collective (every rank calls it with the same arguments).
"""

from __future__ import annotations

import socket

import torch
import torch.distributed as dist

TRANSPORTS = ("nccl", "ce", "auto")


class CopyEngineTransport:
    """Copy-engine all-to-all over a symmetric buffer; see the module docstring."""

    def __init__(self, group, device: torch.device, max_rows: int, max_row_bytes: int) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        self.group, self.device = group, device
        # Its own stream: the symmetric buffer must see one all-to-all at a time, in issue order.
        self.stream = torch.cuda.Stream(device=device, priority=-1)
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.cap, self.row_bytes = int(max_rows), int(max_row_bytes)
        self.buf = symm_mem.empty(self.world * self.cap * self.row_bytes, dtype=torch.uint8, device=device)
        self.handle = symm_mem.rendezvous(self.buf, group)
        self._peers = [self.handle.get_buffer(p, (self.world * self.cap * self.row_bytes,), torch.uint8)
                       for p in range(self.world)]

    def _slot(self, peer_buf: torch.Tensor, slot: int, rows: int, like: torch.Tensor) -> torch.Tensor:
        row_bytes = like.shape[1] * like.element_size() if like.dim() > 1 else like.element_size()
        start = slot * self.cap * self.row_bytes
        view = peer_buf[start:start + rows * row_bytes].view(like.dtype)
        return view.view((rows,) + tuple(like.shape[1:]))

    def check(self, x: torch.Tensor, out_splits, in_splits) -> None:
        row_bytes = x[0].numel() * x.element_size() if x.shape[0] else 0
        if row_bytes > self.row_bytes or max(list(out_splits) + list(in_splits), default=0) > self.cap:
            raise ValueError(f"copy-engine all-to-all: {max(list(out_splits) + list(in_splits))} rows of "
                             f"{row_bytes} B exceed the buffer ({self.cap} rows of {self.row_bytes} B per slot); "
                             "build the transport with larger max_rows / max_row_bytes")

    def all_to_all(self, x: torch.Tensor, out_splits, in_splits, after: torch.cuda.Event | None):
        """Issue the all-to-all on the transport's stream; returns (out, event recorded when out is complete)."""
        self.check(x, out_splits, in_splits)
        stream = self.stream
        if after is not None:
            stream.wait_event(after)
        else:
            stream.wait_stream(torch.cuda.current_stream(x.device))
        send_off = [sum(in_splits[:q]) for q in range(self.world)]
        recv_off = [sum(out_splits[:s]) for s in range(self.world)]
        with torch.cuda.stream(stream):
            out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
            self.handle.barrier(channel=0)
            for q in range(self.world):
                n = in_splits[q]
                if not n:
                    continue
                src = x[send_off[q]:send_off[q] + n]
                dst = out[recv_off[q]:recv_off[q] + n] if q == self.rank else self._slot(self._peers[q], self.rank, n, x)
                dst.copy_(src, non_blocking=True)
            self.handle.barrier(channel=1)
            for s in range(self.world):
                n = out_splits[s]
                if s != self.rank and n:
                    out[recv_off[s]:recv_off[s] + n].copy_(self._slot(self.buf, s, n, x), non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        x.record_stream(stream)
        return out, event


def host_count(group) -> int:
    """How many hosts the group's ranks are on (a collective: every rank calls it)."""
    everyone: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, socket.gethostname(), group=group)
    return len(set(everyone))


def _same_host_with_peer_access(group, device: torch.device) -> tuple[bool, str]:
    world = dist.get_world_size(group)
    here = (socket.gethostname(), device.index)
    everyone: list = [None] * world
    dist.all_gather_object(everyone, here, group=group)
    hosts = {h for h, _ in everyone}
    if len(hosts) > 1:
        return False, f"ranks span {len(hosts)} hosts"
    peers = [d for _, d in everyone if d != device.index]
    no_access = [d for d in peers if not torch.cuda.can_device_access_peer(device.index, d)]
    if no_access:
        return False, f"no peer access from cuda:{device.index} to {no_access}"
    return True, "all ranks on one host with peer access"


def make_transport(kind: str, group, device: torch.device, *, max_rows: int = 0, max_row_bytes: int = 0):
    """``(transport or None, reason)``: None means NCCL (``all_to_all_single``). Collective."""
    if kind not in TRANSPORTS:
        raise ValueError(f"all-to-all transport {kind!r}: use one of {TRANSPORTS}")
    world = dist.get_world_size(group) if dist.is_initialized() else 1
    if kind == "nccl" or world == 1 or device.type != "cuda":
        return None, ("NCCL (asked)" if kind == "nccl" else "no all-to-all at EP 1" if world == 1
                      else "CPU ranks: gloo")
    ok, why = _same_host_with_peer_access(group, device)
    if not ok:
        if kind == "ce":
            raise ValueError(f"copy-engine all-to-all needs every EP rank on one host with peer access: {why}")
        return None, f"NCCL ({why})"
    if max_rows <= 0 or max_row_bytes <= 0:
        raise ValueError("copy-engine all-to-all: give max_rows (largest rows sent by one rank in one call, "
                         "e.g. tokens * topk) and max_row_bytes (hidden * element size)")
    return CopyEngineTransport(group, device, max_rows, max_row_bytes), f"copy engines ({why})"
