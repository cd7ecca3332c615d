"""benchmarks/gpu/profile_layer.py's CPU smoke run: every region runs on 2 gloo ranks and the JSON has the host
profile of each (the GPU trace summaries need CUDA kernels; tests/unit/test_trace_summary.py covers them)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_profile_layer_cpu_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "profile_layer.py"), "--device", "cpu",
                           "--preset", "tiny", "--out", str(tmp_path), "--timeout", "150"],
                          capture_output=True, text=True, timeout=200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((tmp_path / "profile_cpu_r2.json").read_text())
    assert doc["world"] == 2 and len(doc["ranks"]) == 2
    (preset,) = doc["ranks"][0]["presets"]
    assert set(preset["host_profile"]) == {"none", "nodes", "1f1b", "1f1b+wgrad"}
    assert all(rows and rows[0]["tottime_ms"] > 0 for rows in preset["host_profile"].values())
    assert doc["ranks"][1]["presets"][0]["host_profile"] == {}  # only rank 0 profiles the host
