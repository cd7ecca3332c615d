"""Grouped SwiGLU experts with a hand-written backward split into dgrad and wgrad.

Shape legend: S rows (grouped by local expert, ``counts[j]`` rows for expert j), D hidden, F expert ffn
size, L local experts.

Parameters: ``w1`` [L, D, 2F] (columns 0..F-1 are the gate, F..2F-1 the up projection),
``w2`` [L, F, D]. For the rows x of expert j:

    h = x @ w1[j];  gate, up = h[:, :F], h[:, F:]
    a = silu(gate) * up            (computed in fp32, cast back to the rows' dtype)
    y = a @ w2[j]

GEMM path: ``torch._grouped_mm`` where the device and dtype support it (probed once per
(device type, dtype) at run time by comparing against the loop) and the row strides are 16-byte
aligned; otherwise a per-expert loop of ``@``. :func:`expert_path` says which path a call takes.
``torch._grouped_mm``'s own autograd fails on CPU, and the dgrad/wgrad split needs a hand-written
backward anyway, so the backward is explicit:

    dgrad: da = dy @ w2[j].T ; dh = swiglu'(h, da) ; dx = dh @ w1[j].T
    wgrad: dw2[j] = a.T @ dy ;  dw1[j] = x.T @ dh          (zeros for experts with no rows)

Routing weights in the ffn space (``probs_S`` given, one fp32 weight per row): ``a = silu(gate) * up * p``,
so ``y`` already carries the weight and the combine only sums. That is what the dispatcher does where the
rows never leave their rank (EP 1): the combine's backward is then a plain gather of the output gradient,
instead of a pass that also reads every expert output row [S, D] for the weights' gradient, which here
comes from the [S, F] rows the SwiGLU backward reads anyway (dp = sum_f da * silu(gate) * up, fp32).
Megatron-Core's grouped MLP applies the weights in its activation the same way.

With a :class:`~moe_overlap.ep.wgrad.WgradStore`, the wgrad GEMMs are deferred into it as a closure.
Determinism: every op here is a fixed sequence of GEMMs and elementwise ops (no atomics), so the
same inputs give bitwise the same outputs; GEMMs over a different number of rows (another chunking)
may round differently in fp32 (measured on CPU), so chunked vs unchunked agree to rounding only.
"""

from __future__ import annotations

import functools
import itertools

import torch
from torch import nn

from . import fused
from .wgrad import WgradStore, accumulate_grad

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_dtype(dtype: torch.dtype, name: str = "dtype") -> None:
    if dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name}={dtype}: unsupported; use torch.float32, torch.bfloat16 or torch.float16")


@functools.cache
def grouped_mm_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Probe ``torch._grouped_mm`` once: it must exist, run, and match the loop on a tiny problem."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(8, 16, generator=gen).to(device_type, dtype)
        w = torch.randn(3, 16, 16, generator=gen).to(device_type, dtype)
        offs = torch.tensor([3, 3, 8], dtype=torch.int32, device=device_type)
        # The three call forms the experts use: forward, dgrad (transposed weight), wgrad (x.T).
        fwd = torch._grouped_mm(x, w, offs=offs)
        dgrad = torch._grouped_mm(fwd, w.transpose(-2, -1), offs=offs)
        wgrad = torch._grouped_mm(x.t(), fwd, offs=offs)
        checks = [(fwd, torch.cat([x[:3] @ w[0], x[3:8] @ w[2]])),
                  (dgrad, torch.cat([fwd[:3] @ w[0].t(), fwd[3:8] @ w[2].t()])),
                  (wgrad, torch.stack([x[:3].t() @ fwd[:3], torch.zeros_like(w[1]), x[3:8].t() @ fwd[3:8]]))]
        return all(torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2) for got, want in checks)
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def _aligned(*tensors: torch.Tensor) -> bool:
    for t in tensors:
        if t.data_ptr() % 16:
            return False
        if any((s * t.element_size()) % 16 for s, n in zip(t.stride(), t.shape, strict=True) if s != 1 and n > 1):
            return False
    return True


def expert_path(x_SD: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> str:
    """'grouped_mm' or 'loop': the GEMM path a call with these tensors takes."""
    if not grouped_mm_supported(x_SD.device.type, x_SD.dtype):
        return "loop"
    ffn = w2.shape[1]
    if (x_SD.shape[1] * x_SD.element_size()) % 16 or (ffn * x_SD.element_size()) % 16:
        return "loop"
    return "grouped_mm" if _aligned(x_SD, w1, w2) else "loop"


def _offsets(counts, device: torch.device) -> torch.Tensor:
    """Group end offsets (int32) for ``torch._grouped_mm``, built once per expert call.

    Device counts (EP 1 on CUDA, counts.py) give device offsets with a cumsum: no host round trip.
    Host counts: ``torch.tensor(list, device="cuda")`` copies from pageable memory and then synchronizes
    the host with the stream (a hidden host sync that drains the GPU queue); a pinned staging tensor and
    a non-blocking copy keep the host ahead of the GPU. The pinned block is recycled by torch's caching
    host allocator only after the copy has run.
    """
    if isinstance(counts, torch.Tensor):
        return torch.cumsum(counts, 0, dtype=torch.int32)
    ends = list(itertools.accumulate(counts))
    if device.type != "cuda":
        return torch.tensor(ends, dtype=torch.int32, device=device)
    return torch.tensor(ends, dtype=torch.int32, pin_memory=True).to(device, non_blocking=True)


def host_counts(counts) -> tuple[int, ...]:
    """Counts as host ints (a device-to-host sync for device counts: only the loop path needs them)."""
    return tuple(int(c) for c in (counts.tolist() if isinstance(counts, torch.Tensor) else counts))


def _offs_for(path, counts, device):
    return _offsets(counts, device) if path == "grouped_mm" else None


def _gmm(x_MK, w_LKN, counts, path, offs=None) -> torch.Tensor:
    """Row-grouped x @ w[j] -> [M, N]. ``offs``: :func:`_offsets` of counts (built here when None)."""
    if path == "grouped_mm":
        return torch._grouped_mm(x_MK, w_LKN, offs=_offsets(counts, x_MK.device) if offs is None else offs)
    pieces, start = [], 0
    for j, c in enumerate(host_counts(counts)):
        if c:
            pieces.append(x_MK[start:start + c] @ w_LKN[j])
        start += c
    if not pieces:
        return x_MK.new_zeros((0, w_LKN.shape[-1]))
    return torch.cat(pieces)


def _gmm_wgrad(x_MK, dy_MN, counts, path, offs=None) -> torch.Tensor:
    """Per-group x.T @ dy -> [L, K, N]; zeros for empty groups."""
    if path == "grouped_mm":
        return torch._grouped_mm(x_MK.t(), dy_MN, offs=_offsets(counts, x_MK.device) if offs is None else offs)
    out = x_MK.new_zeros((len(counts), x_MK.shape[1], dy_MN.shape[1]))
    start = 0
    for j, c in enumerate(host_counts(counts)):
        if c:
            out[j] = x_MK[start:start + c].t() @ dy_MN[start:start + c]
        start += c
    return out


def _swiglu(h_S2F: torch.Tensor, probs_S: torch.Tensor | None = None) -> torch.Tensor:
    if fused.available(h_S2F):  # one pass instead of five (fp32 upcasts, silu, mul, downcast)
        return fused.swiglu(h_S2F, probs_S)
    ffn = h_S2F.shape[1] // 2
    gate, up = h_S2F[:, :ffn].float(), h_S2F[:, ffn:].float()
    a = torch.nn.functional.silu(gate) * up
    if probs_S is not None:  # (silu * up) * p: the fused kernel's order of the fp32 products
        a = a * probs_S.float().unsqueeze(1)
    return a.to(h_S2F.dtype)


def _swiglu_backward(h_S2F: torch.Tensor, da_SF: torch.Tensor, probs_S: torch.Tensor | None = None):
    """Returns (dh [S, 2F], a [S, F], dprobs [S] fp32 or None): the gradient, the recomputed activation
    for the w2 wgrad (weighted like the forward's) and, with ``probs_S``, the weights' gradient."""
    if fused.available(h_S2F):
        if probs_S is None:
            return (*fused.swiglu_backward(h_S2F, da_SF), None)
        return fused.swiglu_probs_backward(h_S2F, da_SF, probs_S)
    ffn = h_S2F.shape[1] // 2
    gate, up, da = h_S2F[:, :ffn].float(), h_S2F[:, ffn:].float(), da_SF.float()
    sig = torch.sigmoid(gate)
    silu = gate * sig
    dprobs = None
    if probs_S is not None:
        p = probs_S.float().unsqueeze(1)
        dprobs = (da * (silu * up)).sum(1)
        da = da * p
    dgate = da * up * sig * (1.0 + gate * (1.0 - sig))
    return torch.cat([dgate, da * silu], dim=1).to(h_S2F.dtype), _swiglu(h_S2F, probs_S), dprobs


def _check_inputs(x_SD, w1, w2, counts, probs_S=None) -> None:
    check_dtype(x_SD.dtype, "x dtype")
    if x_SD.device != w1.device:
        raise ValueError(f"x device={x_SD.device} != expert weights device={w1.device}")
    if x_SD.dtype != w1.dtype:
        raise ValueError(f"x dtype={x_SD.dtype} != expert weights dtype={w1.dtype}")
    if x_SD.dim() != 2 or x_SD.shape[1] != w1.shape[1]:
        raise ValueError(f"x shape={tuple(x_SD.shape)}: expected [S, hidden={w1.shape[1]}]")
    if probs_S is not None and (probs_S.shape != (x_SD.shape[0],) or probs_S.device != x_SD.device):
        raise ValueError(f"probs_S: shape {tuple(probs_S.shape)} on {probs_S.device}; need [{x_SD.shape[0]}] "
                         f"(one routing weight per row) on {x_SD.device}")
    if isinstance(counts, torch.Tensor):  # device counts: their sum is not checked (it would sync the host)
        if counts.shape != (w1.shape[0],) or counts.device != x_SD.device:
            raise ValueError(f"tokens_per_expert: a device tensor of shape {tuple(counts.shape)} on "
                             f"{counts.device}; need [{w1.shape[0]}] on {x_SD.device}")
        return
    if len(counts) != w1.shape[0] or sum(counts) != x_SD.shape[0]:
        raise ValueError(f"tokens_per_expert={tuple(counts)}: need {w1.shape[0]} counts summing to {x_SD.shape[0]}")


# ------------------------------------------------------------ plain steps (schedules call these)
def experts_forward(x_SD, w1, w2, counts, offs=None, probs_S=None):
    """Returns (y_SD, h_S2F); keep (x_SD, h_S2F) for the backward. ``offs``: the grouped-GEMM offsets
    of ``counts`` when the caller already has them (built here otherwise). ``probs_S``: fp32 routing
    weights of the rows, applied in the ffn space (module docstring), or None."""
    _check_inputs(x_SD, w1, w2, counts, probs_S)
    x_SD = x_SD.contiguous()
    path = expert_path(x_SD, w1, w2)
    offs = _offs_for(path, counts, x_SD.device) if offs is None or path != "grouped_mm" else offs
    h = _gmm(x_SD, w1, counts, path, offs)
    return _gmm(_swiglu(h, probs_S), w2, counts, path, offs), h


def experts_dgrad(dy_SD, x_SD, h_S2F, w1, w2, counts, offs=None, probs_S=None):
    """Returns (dx_SD, wgrad_inputs, dprobs_S fp32 or None); pass wgrad_inputs to :func:`experts_wgrad`.
    ``offs`` as in :func:`experts_forward` (the forward's, reused: one offsets build per layer call);
    ``probs_S``: the forward's."""
    dy_SD = dy_SD.contiguous()
    path = expert_path(x_SD, w1, w2)
    offs = _offs_for(path, counts, x_SD.device) if offs is None or path != "grouped_mm" else offs
    da = _gmm(dy_SD, w2.transpose(-2, -1), counts, path, offs)
    dh, a, dprobs = _swiglu_backward(h_S2F, da, probs_S)
    dx = _gmm(dh, w1.transpose(-2, -1), counts, path, offs)
    return dx, (x_SD, a, dh, dy_SD, offs), dprobs


def experts_wgrad(wgrad_inputs, w1, w2, counts):
    """Returns (dw1 [L, D, 2F], dw2 [L, F, D])."""
    x_SD, a_SF, dh, dy, offs = wgrad_inputs
    path = expert_path(x_SD, w1, w2)
    return _gmm_wgrad(x_SD, dh, counts, path, offs), _gmm_wgrad(a_SF, dy, counts, path, offs)


def defer_or_return_wgrad(wgrad_inputs, w1, w2, counts, store: WgradStore | None):
    """Immediate: return (dw1, dw2). Deferred: push a closure accumulating into .grad, return (None, None)."""
    if store is None:
        return experts_wgrad(wgrad_inputs, w1, w2, counts)

    def closure():
        dw1, dw2 = experts_wgrad(wgrad_inputs, w1, w2, counts)
        accumulate_grad(w1, dw1)
        accumulate_grad(w2, dw2)

    store.defer(closure)
    return None, None


class _ExpertsFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x_SD, w1, w2, probs_S, counts, store):
        offs = _offs_for(expert_path(x_SD, w1, w2), counts, x_SD.device)
        y, h = experts_forward(x_SD, w1, w2, counts, offs, probs_S)
        ctx.save_for_backward(x_SD, h, probs_S)
        ctx.meta = (counts, store, w1, w2, offs)
        return y

    @staticmethod
    def backward(ctx, dy_SD):
        x_SD, h, probs_S = ctx.saved_tensors
        counts, store, w1, w2, offs = ctx.meta
        dx, wgrad_inputs, dprobs = experts_dgrad(dy_SD, x_SD, h, w1.detach(), w2.detach(), counts, offs, probs_S)
        dw1, dw2 = defer_or_return_wgrad(wgrad_inputs, w1, w2, counts, store)
        if dprobs is not None and dprobs.dtype != probs_S.dtype:
            dprobs = dprobs.to(probs_S.dtype)
        return dx, dw1, dw2, dprobs, None, None


class GroupedExperts(nn.Module):
    """L local SwiGLU experts. Parameters ``w1`` [L, D, 2F] and ``w2`` [L, F, D]."""

    def __init__(self, num_local_experts: int, hidden: int, ffn: int, *, dtype=torch.float32, device=None,
                 skip_init: bool = False):
        super().__init__()
        check_dtype(dtype)
        self.w1 = nn.Parameter(torch.empty(num_local_experts, hidden, 2 * ffn, dtype=dtype, device=device))
        self.w2 = nn.Parameter(torch.empty(num_local_experts, ffn, hidden, dtype=dtype, device=device))
        if skip_init:  # the caller writes every parameter (model.init_parameters): no draw to throw away
            return
        # N(0, 1/fan_in) with the default generator; MoELayer overwrites it from its seed.
        nn.init.normal_(self.w1, std=hidden ** -0.5)
        nn.init.normal_(self.w2, std=ffn ** -0.5)

    def forward(self, x_SD: torch.Tensor, tokens_per_expert, wgrad_store: WgradStore | None = None,
                probs_S: torch.Tensor | None = None):
        """x_SD grouped by local expert -> y_SD, same dtype. ``tokens_per_expert``: host ints, or an int64
        device tensor (EP 1 on CUDA: no host sync on the grouped-GEMM path). ``probs_S``: [S] routing
        weights applied in the ffn space (module docstring), or None (the combine applies them)."""
        counts = tokens_per_expert if isinstance(tokens_per_expert, torch.Tensor) else \
            tuple(int(c) for c in tokens_per_expert)
        return _ExpertsFn.apply(x_SD, self.w1, self.w2, probs_S, counts, wgrad_store)

    def path_for(self, x_SD: torch.Tensor) -> str:
        return expert_path(x_SD, self.w1, self.w2)
