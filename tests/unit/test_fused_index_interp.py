"""fused_index's and fused.py's weighted-SwiGLU Triton kernels against the torch path on CPU, through
Triton's interpreter.

Runs only where Triton is importable (CUDA builds of torch ship it; CPU-only CI does not, and the GPU
test tests/gpu/test_fused_gpu.py covers the compiled kernels). TRITON_INTERPRET must be set before the
kernels are decorated, hence the subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import torch
    from moe_overlap.ep import counts as C, dispatcher as dp, fused, fused_index
    fused.available = lambda t: False  # the reference: the torch path
    for T, K, E in [(3, 1, 2), (257, 8, 16), (1000, 6, 32), (1, 2, 4)]:
        g = torch.Generator().manual_seed(T)
        ex = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(T)])
        ex[: T // 2, 0] = E - 1
        ref = dp.plan_permute(ex, E)
        got = fused_index.permute_plan(ex, E)
        want = (ref.perm_N, ref.inv_perm_N, ref.token_N, ref.tokens_per_expert_E)
        assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(got, want)), (T, K, E)
    for cnts in [[[3, 0, 2], [1, 4, 0]], [[0, 0], [0, 0]], [[5]], [[2000, 1], [0, 1500], [7, 7]]]:
        t = torch.tensor(cnts)
        s, u = fused_index.block_transpose_indices(cnts, torch.device("cpu"))
        assert torch.equal(s, C.block_transpose_index(t, int(t.sum()))), cnts
        assert torch.equal(u, C.block_transpose_index(t.t(), int(t.sum()))), cnts
    print("ok")
""")


def _run_under_interpreter(script: str) -> None:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_index_kernels_match_torch_under_interpreter():
    _run_under_interpreter(SCRIPT)


SWIGLU_SCRIPT = textwrap.dedent("""
    import torch
    from moe_overlap.ep import experts, fused  # experts' own path is torch on CPU (fused.available: CUDA only)
    for rows, ffn in [(1, 8), (37, 24), (5, 3000), (64, 768)]:
        g = torch.Generator().manual_seed(rows)
        h = torch.randn(rows, 2 * ffn, generator=g).to(torch.bfloat16)
        da = torch.randn(rows, ffn, generator=g).to(torch.bfloat16)
        p = torch.rand(rows, generator=g)
        a, (dh, a2, dp) = fused.swiglu(h, p), fused.swiglu_probs_backward(h, da, p)
        ra, (rdh, ra2, rdp) = experts._swiglu(h, p), experts._swiglu_backward(h, da, p)
        assert torch.equal(a, a2), (rows, ffn)
        for got, want in ((a, ra), (dh, rdh), (a2, ra2)):  # fp32 math rounded once: within one bf16 ulp
            assert ((got.float() - want.float()).abs() <= 2 ** -7 * want.float().abs() + 1e-6).all(), (rows, ffn)
        torch.testing.assert_close(dp, rdp, rtol=1e-4, atol=1e-4 * ffn ** 0.5)
    for n in (1, 1000, 5000):  # the weights' permutation: a copy, bitwise
        src, idx = torch.rand(n), torch.randperm(n)
        assert torch.equal(fused.gather_1d(src, idx), src.index_select(0, idx)), n
    print("ok")
""")


def test_weighted_swiglu_kernels_match_torch_under_interpreter():
    _run_under_interpreter(SWIGLU_SCRIPT)
