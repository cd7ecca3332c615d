"""benchmarks/peers/peers.py end to end on 2 gloo ranks (tiny preset): our layer in both schedules, torchtitan's MoE
through its own expert parallelism where torchtitan imports, else its import failure recorded (never a crash).
Timings are never asserted, only that they exist."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "peers" / "peers.py"
KEYS = {"out", "dx", "router.weight", "experts.w1", "experts.w2"}
TITAN = importlib.util.find_spec("torchtitan") is not None


@pytest.fixture(scope="module")
def smoke(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--world", "2",
                           "--rounds", "1", "--warmup", "0", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text()), proc.stdout


def test_provenance_and_our_rows(smoke):
    doc, stdout = smoke
    for key in ("command", "date", "machine", "versions", "timing", "tolerance"):
        assert doc[key], key
    assert doc["world"] == 2 and doc["versions"]["torch"]
    assert "| tiny | 2 | ours |" in stdout and "| tiny | 2 | ours chunked:2 |" in stdout
    (p,) = doc["presets"]
    assert p["local_experts"] == 4
    for name in ("ours", "ours chunked:2"):
        row = p["impls"][name]
        assert row["fwd"]["median_ms"] > 0 and row["fwd_bwd"]["median_ms"] > 0, name
        a = p["agreement_rel_l2"][name]
        assert set(a["vs_ours"]) == set(a["vs_fp32"]) == KEYS
        assert max(a["vs_fp32"].values()) < 2e-2, a  # bf16 against the fp32 run of the same weights
    assert max(p["agreement_rel_l2"]["ours"]["vs_ours"].values()) == 0.0
    assert max(p["agreement_rel_l2"]["ours chunked:2"]["vs_ours"].values()) < 2e-2
    assert "megatron" not in p["impls"] and any("megatron skipped on CPU" in n for n in doc["notes"])


@pytest.mark.skipif(TITAN, reason="torchtitan is importable here: its rows are checked instead")
def test_without_torchtitan_its_failure_is_recorded(smoke):
    doc, stdout = smoke
    (p,) = doc["presets"]
    assert "torchtitan" not in p["impls"]
    assert "ModuleNotFoundError" in p["errors"]["torchtitan"]
    assert "| tiny | 2 | torchtitan | did not run: ModuleNotFoundError" in stdout


@pytest.mark.skipif(not TITAN, reason="torchtitan not importable here")
def test_torchtitan_expert_parallel_agrees_with_ours(smoke):
    doc, stdout = smoke
    (p,) = doc["presets"]
    assert not p["errors"], p["errors"]
    row = p["impls"]["torchtitan"]
    assert row["fwd_bwd"]["median_ms"] > 0
    assert row["describe"]["parallel_dims"] == {"dp_shard": 2, "ep": 2}
    assert row["describe"]["spmd_backend"] == "spmd_types"
    a = p["agreement_rel_l2"]["torchtitan"]
    # Same weights, routing and tokens: only bf16 rounding differs (its CPU router runs in bf16: CPU
    # autocast has no fp32 target, so the router gradient is the loosest).
    assert max(a["vs_ours"].values()) < doc["tolerance"], a
    assert max(a["vs_fp32"].values()) < doc["tolerance"], a
    assert doc["versions"]["torchtitan"] and "| tiny | 2 | torchtitan |" in stdout
