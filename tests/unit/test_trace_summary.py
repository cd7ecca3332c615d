"""benchmarks/gpu/trace_summary.py on hand-made chrome traces: windows, stream busy time, gaps, overlap."""

import json

import pytest

from benchmarks.gpu.trace_summary import category, intersect, load, summarize, table, union


def _rt(name, ts, dur, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _k(name, ts, dur, corr, stream, grid=None):
    args = {"correlation": corr, "stream": stream, **({"grid": grid} if grid else {})}
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": args}


def _trace():
    """One 'pair#0' window: a GEMM on stream 7 [100, 300), a 50 us gap (ended while the host sat in
    cudaStreamSynchronize), a triton kernel [350, 400); NCCL on stream 20 [150, 450)."""
    return [
        {"ph": "X", "cat": "user_annotation", "name": "pair#0", "ts": 0, "dur": 360},
        _rt("cudaLaunchKernel", 10, 5, 1), _k("sm90_xmma_gemm_bf16", 100, 200, 1, 7, [132, 1, 1]),
        _rt("cudaLaunchKernel", 20, 5, 2), _k("ncclDevKernel_SendRecv", 150, 300, 2, 20, [2, 1, 1]),
        _rt("cudaStreamSynchronize", 30, 320, 99),
        _rt("cudaLaunchKernel", 352, 4, 3), _k("_swiglu_fwd_kernel", 350, 50, 3, 7),
        # outside any window: ignored
        _rt("cudaLaunchKernel", 900, 5, 4), _k("other", 950, 10, 4, 7),
    ]


def test_union_and_intersect():
    assert union([(5, 7), (0, 2), (1, 3)]) == [(0, 3), (5, 7)]
    assert intersect([(0, 3), (5, 7)], [(2, 6)]) == pytest.approx(2.0)


def test_categories():
    assert category("ncclDevKernel_AllToAll") == "nccl"
    assert category("sm90_xmma_gemm_bf16bf16") == "gemm"
    assert category("_weighted_gather_sum_kernel") == "triton"
    assert category("elementwise_kernel") == "other"


def test_summary_of_one_window(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": _trace()}))
    s = summarize(load(path))["pair"]
    assert s["windows"] == 1
    assert s["wall_ms"] == pytest.approx(0.45)  # host start 0 -> last GPU op end 450 us
    assert s["compute_stream"] == "7"
    assert s["streams"]["7"]["busy_ms"] == pytest.approx(0.25)
    assert s["streams"]["20"]["nccl"] is True
    # Gaps on the compute stream: [0, 100) before the first kernel and [300, 350).
    assert s["compute_idle_ms"] == pytest.approx(0.15)
    assert s["top_gaps"][0]["host_call_at_end"] == "cudaStreamSynchronize"
    assert s["nccl_ms"] == pytest.approx(0.3)
    assert s["nccl_blocks"] == 2  # the NCCL kernel's grid, not the GEMM's
    assert s["comm_concurrent_ms"] == pytest.approx(0.2)  # [150, 300) + [350, 400)
    assert s["host"]["blocking_calls"] == 1 and s["host"]["blocking_ms"] == pytest.approx(0.32)
    assert s["categories_ms"]["gemm"] == pytest.approx(0.2)
    assert "| pair |" in table({"pair": s})
