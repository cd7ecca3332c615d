"""benchmarks/gpu/gemm_rate.py on CPU: the six expert GEMMs (both paths agree), the flop count, the JSON, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.gpu import gemm_rate as gr
from benchmarks.gpu import gpu_sections as gs


def test_flops_are_the_six_gemms():
    s = dict(experts=3, rows=5, hidden=7, ffn=11)
    S, D, F = 15, 7, 11
    by_gemm = 2 * S * D * 2 * F + 2 * S * F * D  # forward: x@w1 [S, 2F], a@w2 [S, D]
    assert gr.flops(s) == 3 * by_gemm  # dgrad and wgrad: the same again each


def test_grouped_and_loop_paths_agree_and_shapes_are_right():
    torch.manual_seed(0)
    L, R, D, F = 3, 8, 16, 8  # bf16 rows 16-byte aligned: what _grouped_mm needs
    S = L * R
    x, a, dy, dh = torch.randn(S, D), torch.randn(S, F), torch.randn(S, D), torch.randn(S, 2 * F)
    w1, w2 = torch.randn(L, D, 2 * F), torch.randn(L, F, D)
    counts = (R,) * L
    loop = gs.expert_gemms(x, a, dy, dh, w1, w2, None, counts, "loop")
    assert [tuple(t.shape) for t in loop] == [(S, 2 * F), (S, D), (S, F), (S, D), (L, D, 2 * F), (L, F, D)]
    j = 1  # second expert's rows, by hand
    rows = slice(j * R, (j + 1) * R)
    torch.testing.assert_close(loop[0][rows], x[rows] @ w1[j])
    torch.testing.assert_close(loop[5][j], a[rows].t() @ dy[rows])
    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("this torch has no _grouped_mm")
    offs = torch.tensor([R * (i + 1) for i in range(L)], dtype=torch.int32)
    try:
        grouped = gs.expert_gemms(x.bfloat16(), a.bfloat16(), dy.bfloat16(), dh.bfloat16(), w1.bfloat16(),
                                  w2.bfloat16(), offs)
    except RuntimeError as exc:
        pytest.skip(f"_grouped_mm does not run on this CPU build: {exc}")
    for g, ref in zip(grouped, loop, strict=True):
        torch.testing.assert_close(g.float(), ref, rtol=0.05, atol=0.3)


def test_cpu_run_writes_the_table_and_json(tmp_path, capsys):
    out = tmp_path / "g.json"
    assert gr.main(["--device", "cpu", "--shapes", "tiny-b", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| tiny-b | 2 x 16 | 32 | 16 |" in table
    data = json.loads(out.read_text())
    assert data["command"].startswith("python benchmarks/gpu/gemm_rate.py --device cpu")
    assert data["date"] and data["machine"]["cpu_count"] and data["versions"]["torch"] == torch.__version__
    r = data["shapes"]["tiny-b"]
    assert r["iters"] >= 20 and r["path"] in ("grouped_mm", "loop")
    assert r["tflops"] == pytest.approx(r["flops"] / (r["median_ms"] * 1e-3) / 1e12, rel=1e-2)


def test_anchor_shape_is_the_proxy_per_rank():
    s = gr.SHAPES["dsv3-proxy-ep8"]  # 4096 tokens x top-8 over 32 experts at EP8
    assert (s["experts"], s["experts"] * s["rows"], s["hidden"], s["ffn"]) == (32 // 8, 4096 * 8, 7168, 2048)


@pytest.mark.parametrize("argv, field", [(["--iters", "5"], "--iters"), (["--shapes", "nope"], "--shapes"),
                                         (["--warmup", "-1"], "--warmup")])
def test_bad_input_names_the_option(argv, field, capsys):
    assert gr.main(["--device", "cpu", *argv]) == 2
    assert field in capsys.readouterr().err
