"""Fused Triton kernels for the memory-bound steps of the GPU path (SwiGLU, with or without the routing
weights; the combine's un-permute; the weights' permutation).

Shape legend: S expert rows, F expert ffn size, T tokens, K top-k, N = T*K routed rows, D hidden.

Why: written as torch ops, SwiGLU in fp32 and the fp32-weighted un-permute each take 5 to 10 passes
over their tensors (upcast, multiply, add, downcast, each a kernel with its own read and write).
At EP 1 on an H200 that costs more than the grouped GEMMs can absorb (benchmarks/gpu/gpu_layer.py
measures both). Each kernel here reads its inputs once and writes its outputs once; the arithmetic
stays in fp32 exactly as in the torch path, so the results agree to the last bit of the fp32 math
up to summation order (within one rounding of the output dtype).

Determinism: no atomics; every output element is written by exactly one program and every sum has
a fixed order, so the same inputs give bitwise the same outputs on every run.

``available(t)`` is True only for CUDA tensors with Triton importable; callers keep the torch path
otherwise (CPU, CI). ``MOE_OVERLAP_FUSED=0`` turns the kernels off (ablations in the benchmark).
"""

from __future__ import annotations

import os

import torch

try:  # Triton ships with CUDA builds of torch; CPU-only installs (CI) do not have it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on CPU-only machines
    triton = None


def available(t: torch.Tensor) -> bool:
    return triton is not None and t.is_cuda and os.environ.get("MOE_OVERLAP_FUSED", "1") != "0"


if triton is not None:

    @triton.jit
    def _swiglu_fwd_kernel(h_ptr, a_ptr, p_ptr, n, ffn, HAS_P: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        row = i // ffn
        base = row * (2 * ffn) + (i - row * ffn)
        g = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + base + ffn, mask=mask, other=0.0).to(tl.float32)
        silu = g / (1.0 + tl.exp(-g))
        a = silu * u
        if HAS_P:  # the row's routing weight, applied in the ffn space (experts.py, "Routing weights")
            a = a * tl.load(p_ptr + row, mask=mask, other=0.0)
        tl.store(a_ptr + i, a.to(a_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_bwd_kernel(h_ptr, da_ptr, dh_ptr, a_ptr, n, ffn, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        row = i // ffn
        base = row * (2 * ffn) + (i - row * ffn)
        g = tl.load(h_ptr + base, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(h_ptr + base + ffn, mask=mask, other=0.0).to(tl.float32)
        da = tl.load(da_ptr + i, mask=mask, other=0.0).to(tl.float32)
        sig = 1.0 / (1.0 + tl.exp(-g))
        silu = g / (1.0 + tl.exp(-g))
        dgate = da * u * sig * (1.0 + g * (1.0 - sig))
        out_ty = dh_ptr.dtype.element_ty
        tl.store(dh_ptr + base, dgate.to(out_ty), mask=mask)
        tl.store(dh_ptr + base + ffn, (da * silu).to(out_ty), mask=mask)
        # The activation is recomputed here for the w2 weight gradient: one extra write instead of
        # keeping [S, F] alive from forward to backward.
        tl.store(a_ptr + i, (silu * u).to(a_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _swiglu_probs_bwd_kernel(h_ptr, da_ptr, p_ptr, dh_ptr, a_ptr, dp_ptr, ffn, BLOCK_F: tl.constexpr,
                                 NUM_F_BLOCKS: tl.constexpr):
        """One row per program: a = silu(g) * u * p, so dh = p * (the SwiGLU gradient of da) and
        dp = sum_f da * silu(g) * u (fp32, f in order: deterministic); a is recomputed for the w2 wgrad."""
        r = tl.program_id(0).to(tl.int64)
        p = tl.load(p_ptr + r).to(tl.float32)
        acc = tl.zeros([BLOCK_F], dtype=tl.float32)
        out_ty = dh_ptr.dtype.element_ty
        for b in range(NUM_F_BLOCKS):  # constexpr trip count (runs under TRITON_INTERPRET too)
            f = b * BLOCK_F + tl.arange(0, BLOCK_F)
            mask = f < ffn
            g = tl.load(h_ptr + r * (2 * ffn) + f, mask=mask, other=0.0).to(tl.float32)
            u = tl.load(h_ptr + r * (2 * ffn) + ffn + f, mask=mask, other=0.0).to(tl.float32)
            da = tl.load(da_ptr + r * ffn + f, mask=mask, other=0.0).to(tl.float32)
            sig = 1.0 / (1.0 + tl.exp(-g))
            silu = g / (1.0 + tl.exp(-g))
            act = silu * u
            acc += da * act
            dap = da * p
            tl.store(dh_ptr + r * (2 * ffn) + f, (dap * u * sig * (1.0 + g * (1.0 - sig))).to(out_ty), mask=mask)
            tl.store(dh_ptr + r * (2 * ffn) + ffn + f, (dap * silu).to(out_ty), mask=mask)
            tl.store(a_ptr + r * ffn + f, (act * p).to(a_ptr.dtype.element_ty), mask=mask)
        tl.store(dp_ptr + r, tl.sum(acc, axis=0))

    @triton.jit
    def _gather_1d_kernel(src_ptr, idx_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < n
        j = tl.load(idx_ptr + i, mask=mask, other=0)
        tl.store(out_ptr + i, tl.load(src_ptr + j, mask=mask), mask=mask)

    @triton.jit
    def _unpermute_fwd_kernel(y_ptr, inv_ptr, p_ptr, out_ptr, D, K: tl.constexpr, K_PAD: tl.constexpr,
                              HAS_P: tl.constexpr, BLOCK_D: tl.constexpr):
        """out[t, d] = sum_k p[t, k] * y[inv[t*K + k], d]  (fp32 sum, k in order of the tile)."""
        t = tl.program_id(0).to(tl.int64)
        ks = tl.arange(0, K_PAD)
        kmask = ks < K
        rows = tl.load(inv_ptr + t * K + ks, mask=kmask, other=0).to(tl.int64)
        d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
        dmask = d < D
        y = tl.load(y_ptr + rows[:, None] * D + d[None, :], mask=kmask[:, None] & dmask[None, :],
                    other=0.0).to(tl.float32)
        if HAS_P:
            p = tl.load(p_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.float32)
            y = y * p[:, None]
        tl.store(out_ptr + t * D + d, tl.sum(y, axis=0).to(out_ptr.dtype.element_ty), mask=dmask)

    @triton.jit
    def _unpermute_bwd_kernel(g_ptr, y_ptr, inv_ptr, p_ptr, gy_ptr, gp_ptr, D, K: tl.constexpr,
                              K_PAD: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D_BLOCKS: tl.constexpr):
        """gy[inv[t*K+k]] = p[t, k] * g[t];  gp[t, k] = sum_d g[t, d] * y[inv[t*K+k], d]  (fp32)."""
        t = tl.program_id(0).to(tl.int64)
        ks = tl.arange(0, K_PAD)
        kmask = ks < K
        rows = tl.load(inv_ptr + t * K + ks, mask=kmask, other=0).to(tl.int64)
        p = tl.load(p_ptr + t * K + ks, mask=kmask, other=0.0).to(tl.float32)
        acc = tl.zeros([K_PAD], dtype=tl.float32)
        for b in range(NUM_D_BLOCKS):  # constexpr trip count (runs under TRITON_INTERPRET too)
            d = b * BLOCK_D + tl.arange(0, BLOCK_D)
            dmask = d < D
            m2 = kmask[:, None] & dmask[None, :]
            g = tl.load(g_ptr + t * D + d, mask=dmask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + rows[:, None] * D + d[None, :], mask=m2, other=0.0).to(tl.float32)
            acc += tl.sum(y * g[None, :], axis=1)
            tl.store(gy_ptr + rows[:, None] * D + d[None, :], (p[:, None] * g[None, :]).to(gy_ptr.dtype.element_ty),
                     mask=m2)
        tl.store(gp_ptr + t * K + ks, acc, mask=kmask)


_BLOCK = 1024
FWD_BLOCK_D = 1024  # tile widths over D of the un-permute kernels (see the sweep in benchmarks/gpu/gpu_layer.py)
BWD_BLOCK_D = 512


def swiglu(h_S2F: torch.Tensor, probs_S: torch.Tensor | None = None) -> torch.Tensor:
    """silu(h[:, :F]) * h[:, F:] (* probs_S[:, None] if given) in fp32, cast to h's dtype: [S, 2F] -> [S, F]."""
    h = h_S2F.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    a = h.new_empty((rows, ffn))
    n = rows * ffn
    if n:
        p = h if probs_S is None else probs_S.float().contiguous()  # dummy pointer when HAS_P is False
        _swiglu_fwd_kernel[(triton.cdiv(n, _BLOCK),)](h, a, p, n, ffn, HAS_P=probs_S is not None, BLOCK=_BLOCK)
    return a


def swiglu_backward(h_S2F: torch.Tensor, da_SF: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (dh [S, 2F], a [S, F]) in h's dtype; the math of experts._swiglu_backward."""
    h, da = h_S2F.contiguous(), da_SF.contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    dh, a = torch.empty_like(h), h.new_empty((rows, ffn))
    n = rows * ffn
    if n:
        _swiglu_bwd_kernel[(triton.cdiv(n, _BLOCK),)](h, da, dh, a, n, ffn, BLOCK=_BLOCK)
    return dh, a


def swiglu_probs_backward(h_S2F: torch.Tensor, da_SF: torch.Tensor, probs_S: torch.Tensor):
    """Returns (dh [S, 2F], a [S, F] in h's dtype, dprobs [S] fp32) for ``swiglu(h, probs_S)``."""
    h, da, p = h_S2F.contiguous(), da_SF.contiguous(), probs_S.float().contiguous()
    rows, ffn = h.shape[0], h.shape[1] // 2
    dh, a = torch.empty_like(h), h.new_empty((rows, ffn))
    # The kernel writes every row's dp; with F == 0 they are empty sums (zeros). No fill kernel otherwise:
    # this layer's host issue time is what bounds it at small shapes (benchmarks/gpu/gpu_layer.py, host ops).
    dp = (torch.empty if ffn else torch.zeros)(rows, dtype=torch.float32, device=h.device)
    if rows and ffn:
        block_f = min(_BLOCK, triton.next_power_of_2(ffn))
        _swiglu_probs_bwd_kernel[(rows,)](h, da, p, dh, a, dp, ffn, BLOCK_F=block_f,
                                          NUM_F_BLOCKS=triton.cdiv(ffn, block_f), num_warps=4)
    return dh, a, dp


def gather_1d(src: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """src.flatten()[idx] (a copy: bitwise index_select's). Why a kernel for this: on CUDA a 1-D
    index_select issues ~10 host ops (a gather, expands, strided views, a resize); the routing weights'
    permutation runs twice per layer and step, and small layers are host-bound (benchmarks/gpu/gpu_layer.py)."""
    if not src.is_contiguous():  # the kernel reads src as one flat array (an attribute check: no op issued)
        src = src.contiguous()
    out = src.new_empty(idx.shape)
    n = idx.numel()
    if n:
        _gather_1d_kernel[(triton.cdiv(n, _BLOCK),)](src, idx, out, n, BLOCK=_BLOCK)
    return out


def _k_pad(k: int) -> int:
    return max(2, triton.next_power_of_2(k))


def weighted_gather_sum(y_ND: torch.Tensor, inv_perm_N: torch.Tensor, probs_TK: torch.Tensor | None,
                        num_tokens: int, topk: int, *, block_d: int | None = None,
                        num_warps: int = 4) -> torch.Tensor:
    """out[t] = sum_k probs[t, k] * y[inv_perm[t*K + k]] (probs None: weight 1), fp32 sum -> y's dtype.

    ``block_d``/``num_warps``: tile width over D and warps per program (benchmarks/gpu/gpu_layer.py sweeps them).
    """
    y = y_ND.contiguous()
    dim = y.shape[1]
    out = y.new_empty((num_tokens, dim))
    if num_tokens and dim:
        p = probs_TK.contiguous() if probs_TK is not None else y  # dummy pointer when HAS_P is False
        block_d = block_d or min(FWD_BLOCK_D, triton.next_power_of_2(dim))
        grid = (num_tokens, triton.cdiv(dim, block_d))
        _unpermute_fwd_kernel[grid](y, inv_perm_N, p, out, dim, K=topk, K_PAD=_k_pad(topk),
                                    HAS_P=probs_TK is not None, BLOCK_D=block_d, num_warps=num_warps)
    return out


def weighted_gather_sum_backward(g_TD: torch.Tensor, y_ND: torch.Tensor, inv_perm_N: torch.Tensor,
                                 probs_TK: torch.Tensor, *, block_d: int | None = None,
                                 num_warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (g_ND in y's dtype, g_probs_TK fp32) for :func:`weighted_gather_sum` with probs."""
    g, y, p = g_TD.contiguous(), y_ND.contiguous(), probs_TK.contiguous()
    num_tokens, topk = p.shape
    dim = y.shape[1]
    g_y = y.new_empty(y.shape)
    # The kernel writes every (t, k); with D == 0 the dot products are empty sums (zeros).
    g_p = (torch.empty if dim else torch.zeros)((num_tokens, topk), dtype=torch.float32, device=y.device)
    if num_tokens and dim:
        block_d = block_d or min(BWD_BLOCK_D, triton.next_power_of_2(dim))
        _unpermute_bwd_kernel[(num_tokens,)](g, y, inv_perm_N, p, g_y, g_p, dim, K=topk,
                                             K_PAD=_k_pad(topk), BLOCK_D=block_d,
                                             NUM_D_BLOCKS=triton.cdiv(dim, block_d), num_warps=num_warps)
    return g_y, g_p
