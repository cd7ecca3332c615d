"""Triton kernels that build the dispatcher's index tensors in one launch each (GPU only).

Shape legend: T tokens, K top-k, N = T*K routed rows, E experts, A x B blocks of rows (A source ranks by
B local experts), S rows in those blocks.

Why: the torch ops they replace are cheap on the GPU but not on the host. At the Qwen3-30B-A3B shape a
layer is host-bound (benchmarks/gpu/profile_layer.py: the GPU's compute stream is busy 0.2-0.7 of the time),
and the permutation plan (stable sort, inverse by index_put, searchsorted counts, token ids) and the
EP > 1 sort/unsort indices (two cumsum + repeat_interleave chains) cost ~25 host ops per layer. Each
kernel here is one launch (plus its output allocations) and computes exactly the same integers:

* :func:`permute_plan` gives what ``dispatcher.plan_permute``'s stable sort gives. Program e scans the
  ids twice: first it counts the ids below e (its group's start) and equal to e, then it writes the
  positions of its own ids in order (a block-wise prefix sum), so the order within an expert is the
  order of the assignments (stable), with no atomics. It reads the N ids 2E times from L2: at N 32768 it
  took 0.074 ms of GPU time (E 128, 1024-id steps) and 0.054 ms (E 32, 4096-id steps) on an H200, against
  ~65 host ops saved per layer (benchmarks/results/h200x2_2026-11-29_r3/gpu_layer_*.json, profiles).
* :func:`block_transpose_indices` gives ``counts.block_transpose_index`` in both directions at once from
  a small host table of block offsets (the counts are host ints at EP > 1 anyway).

Integers only: the results are bitwise those of the torch path (tests/gpu/test_fused_gpu.py).
"""

from __future__ import annotations

import itertools

import torch

from .fused import triton

if triton is not None:
    import triton.language as tl

    @triton.jit
    def _permute_plan_kernel(ids_ptr, perm_ptr, inv_ptr, tok_ptr, counts_ptr, n, topk, num_experts,
                             BLOCK: tl.constexpr):
        e = tl.program_id(0)
        below = tl.zeros([BLOCK], dtype=tl.int32)
        equal = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            v = tl.load(ids_ptr + i, mask=i < n, other=num_experts)  # padding: neither below nor equal
            below += (v < e).to(tl.int32)
            equal += (v == e).to(tl.int32)
        base = tl.sum(below, axis=0)
        tl.store(counts_ptr + e, tl.sum(equal, axis=0).to(tl.int64))
        for start in range(0, n, BLOCK):
            i = start + tl.arange(0, BLOCK)
            v = tl.load(ids_ptr + i, mask=i < n, other=num_experts)
            hit = (v == e).to(tl.int32)
            pos = base + tl.cumsum(hit, axis=0) - hit  # exclusive prefix: stable order within expert e
            m = hit != 0
            i64 = i.to(tl.int64)
            tl.store(perm_ptr + pos, i64, mask=m)
            tl.store(inv_ptr + i64, pos.to(tl.int64), mask=m)
            tl.store(tok_ptr + pos, i64 // topk, mask=m)
            base += tl.sum(hit, axis=0)

    @triton.jit
    def _block_transpose_kernel(table_ptr, sort_ptr, unsort_ptr, num_blocks, BLOCK: tl.constexpr):
        """table rows: src start (a-major), dst start (b-major), count; one program per block and tile."""
        blk = tl.program_id(0)
        j = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        src = tl.load(table_ptr + blk)
        dst = tl.load(table_ptr + num_blocks + blk)
        cnt = tl.load(table_ptr + 2 * num_blocks + blk)
        m = j < cnt
        tl.store(sort_ptr + dst + j, src + j, mask=m)
        tl.store(unsort_ptr + src + j, dst + j, mask=m)


_PLAN_BLOCK = 4096  # each program walks the ids twice, one block per step: a long block means few latency-bound steps
_BT_BLOCK = 1024


def permute_plan(experts_TK: torch.Tensor, num_experts: int):
    """(perm_N, inv_perm_N, token_N, counts_E), int64 on the ids' device: the stable sort's plan."""
    ids = experts_TK.reshape(-1).contiguous()
    n = ids.numel()
    perm, inv, tok = (torch.empty(n, dtype=torch.int64, device=ids.device) for _ in range(3))
    counts = torch.empty(num_experts, dtype=torch.int64, device=ids.device)
    _permute_plan_kernel[(num_experts,)](ids, perm, inv, tok, counts, n, experts_TK.shape[1], num_experts,
                                         BLOCK=_PLAN_BLOCK, num_warps=8)
    return perm, inv, tok, counts


def block_transpose_indices(counts_AB: list[list[int]], device: torch.device):
    """(sort_idx, unsort_idx) int64 on ``device`` for host counts ``counts_AB`` (A x B blocks).

    sort_idx regroups rows laid out a-major into b-major order (``counts.block_transpose_index`` of the
    counts), unsort_idx is its inverse (the same of the transposed counts).
    """
    a, b = len(counts_AB), len(counts_AB[0])
    flat = [c for row in counts_AB for c in row]
    src = [0, *itertools.accumulate(flat)][:-1]  # a-major starts
    by_b = [counts_AB[i][j] for j in range(b) for i in range(a)]
    dst_b = [0, *itertools.accumulate(by_b)][:-1]  # b-major starts, indexed j*A + i
    dst = [dst_b[j * a + i] for i in range(a) for j in range(b)]
    total = sum(flat)
    # Pinned + non_blocking: a pageable host->device copy would synchronize the host with the stream.
    table = torch.tensor(src + dst + flat, dtype=torch.int64, pin_memory=device.type == "cuda")
    table = table.to(device, non_blocking=True)
    sort_idx = torch.empty(total, dtype=torch.int64, device=device)
    unsort_idx = torch.empty(total, dtype=torch.int64, device=device)
    most = max(flat, default=0)
    if most:
        _block_transpose_kernel[(a * b, triton.cdiv(most, _BT_BLOCK))](table, sort_idx, unsort_idx, a * b,
                                                                        BLOCK=_BT_BLOCK)
    return sort_idx, unsort_idx


__all__ = ["block_transpose_indices", "permute_plan"]
