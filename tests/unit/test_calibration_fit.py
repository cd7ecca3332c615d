"""Calibration never reports an infinite rate when its fit cannot resolve a term."""

import pytest

from moe_overlap.verify.calibrate.machine import A2A_BYTES, LOCAL_SHAPES, calibration_from


def _per_rank(local_time, a2a_time, dense=40e9):
    sizes = {"rows": 1024, "d": 512, "mm_n": 512, "esize": 4, "mm_iters": 3,
             "a2a_off_rank_bytes": [b / 2 for b in A2A_BYTES]}
    times = {"dense": 2 * 512**3 / dense, "gather": 2 * 1024 * 2 * 512 * 4 / 2e9}
    for i, shape in enumerate(LOCAL_SHAPES):
        times[f"local_{i}"] = local_time(*shape)
    for j, b in enumerate(sizes["a2a_off_rank_bytes"]):
        times[f"a2a_{j}"] = a2a_time(b)
    big = times[f"a2a_{len(A2A_BYTES) - 1}"]
    times["mm_loop"], times["both"] = big, 1.5 * big
    return [{"sizes": sizes, "rounds": [times, times, times]}] * 2


def test_host_bound_probes_fall_back_to_the_dense_rate():
    # Every local probe takes the same 3.5 ms whatever its FLOPs: the GEMM term fits to zero.
    dense = 40e9
    cal = calibration_from(_per_rank(lambda *shape: 3.5e-3, lambda b: 1e-4 + b / 1e9, dense),
                           backend="gloo", precision="bf16")
    assert cal.expert_tflops == pytest.approx(dense / 1e12, rel=1e-6)
    assert "expert GEMM rate not resolved" in cal.source
    assert cal.a2a_gbps == pytest.approx(1.0, rel=1e-3)


def test_flat_all_to_all_falls_back_to_the_largest_probe():
    cal = calibration_from(_per_rank(lambda t, d, f, e, k: 1e-3 + 18 * d * f * t * k / 50e9, lambda b: 2e-3),
                           backend="gloo", precision="fp32")
    largest = A2A_BYTES[-1] / 2
    assert cal.a2a_gbps == pytest.approx(largest / 2e-3 / 1e9, rel=1e-6)
    assert "all-to-all bandwidth not resolved" in cal.source
    assert cal.expert_tflops == pytest.approx(0.05, rel=1e-2)
