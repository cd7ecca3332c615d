"""benchmarks/contention/gemm_beside.py off the GPU: its refusals, and the figures its results README quotes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.contention import gemm_beside

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks/results/h200_2026-12-02_beside"

# summary() key -> how the README quotes its range (two decimals)
QUOTED = {
    "margin 0 beside spin": "x{lo}-{hi} (spin)",
    "margin 0 beside copy": "x{lo}-{hi} (copy)**",
    "margin k beside spin-16": "x{lo}-2.05 for k = 16",  # spin's low end, copy's high end
    "margin k beside copy-16": "x1.95-{hi} for k = 16",
    "margin 2k beside spin, over margin 2k alone": "x{lo}-{hi} (spin) and",
    "margin 2k beside copy, over margin 2k alone": "x{lo}-{hi} (copy) of the same margin alone",
    "margin 8 alone": "x{lo}-{hi} at 8,",
    "margin 32 alone": "x{lo}-{hi} at 32,",
    "copy over spin at margin 2k": "x{lo}-{hi} of the spin holder's time",
}
# the same, in TB/s with two decimals
QUOTED_TBPS = {"copy holder GB/s alone (read + write)": "moves {lo}-{hi} TB/s alone"}


def test_readme_quotes_the_summary():
    rows = gemm_beside.summary(json.loads((RESULTS / "gemm_beside.json").read_text(encoding="utf-8")))
    readme = " ".join((RESULTS / "README.md").read_text(encoding="utf-8").split())
    for key, text in QUOTED.items():
        lo, hi = rows[key]
        quoted = text.format(lo=f"{lo:.2f}", hi=f"{hi:.2f}")
        assert quoted in readme, (key, quoted)
    for key, text in QUOTED_TBPS.items():
        lo, hi = rows[key]
        assert text.format(lo=f"{lo / 1e3:.2f}", hi=f"{hi / 1e3:.2f}") in readme, key
    unpadded = gemm_beside.summary(json.loads((RESULTS / "gemm_beside_unpadded.json").read_text(encoding="utf-8")))
    lo = min(unpadded[f"margin 2k beside {k}, over margin 2k alone"][0] for k in ("spin", "copy"))
    hi = max(unpadded[f"margin 2k beside {k}, over margin 2k alone"][1] for k in ("spin", "copy"))
    assert f"x{lo:.2f}-{hi:.2f} of that margin alone" in readme
    # the findings the advice rests on: margin k fails for k = 2, 4, 16 and 2k always fits
    for k in (2, 4, 16):
        assert rows[f"margin k beside spin-{k}"][0] > 1.7
    assert rows["margin k beside spin-8"][1] < 1.1
    assert rows["margin 2k beside spin, over margin 2k alone"][1] < 1.06
    assert rows["late wait ms, margin 2k, spin"][1] < 0.05


def test_summary_flag_reads_a_file_and_refuses_others(tmp_path, capsys):
    assert gemm_beside.main(["--summary", str(RESULTS / "gemm_beside.json")]) == 0
    assert "margin 0 beside spin: " in capsys.readouterr().out
    bad = tmp_path / "x.json"
    bad.write_text("{}", encoding="utf-8")
    assert gemm_beside.main(["--summary", str(bad)]) == 2
    assert "not a gemm_beside.py results file" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [(["--shapes", "nope"], "--shapes: unknown nope"),
                                        (["--iters", "3"], "--iters must be >= 10"),
                                        (["--holders", "0"], "each --holders value > 0")])
def test_bad_arguments_name_the_flag(argv, says, capsys):
    assert gemm_beside.main(argv) == 2
    assert says in capsys.readouterr().err


def test_no_gpu_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.setattr(gemm_beside.torch.cuda, "is_available", lambda: False)
    assert gemm_beside.main(["--shapes", "qwen3-ep2"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
