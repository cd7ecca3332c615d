"""A finished run whose overlap modes are made 1.25x, 1.5x and 2x slower, judged again with `verify --judge`:
the verdict is never `passed`, on CPU (throughput not judged) or as a CUDA run (throughput judged)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moe_overlap.verify.api import run_verification
from moe_overlap.verify.plan.options import VerifyOptions
from tests.distributed._verify_util import assert_report_valid

pytestmark = pytest.mark.slow


def _slow_down(run_dir, factor: float, device: str | None = None) -> None:
    """Rewrite every rank's step records: the overlap modes' step times x factor (tokens/s / factor)."""
    for path in (run_dir / "ranks").glob("rank*.jsonl"):
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "step" and rec.get("mode") != "baseline":
                rec["step_time_s"] *= factor
                rec["tokens_per_s"] /= factor
            out.append(json.dumps(rec))
        path.write_text("\n".join(out) + "\n", encoding="utf-8")
    if device is not None:
        plan = json.loads((run_dir / "plan.json").read_text(encoding="utf-8"))
        plan["device"] = device
        (run_dir / "plan.json").write_text(json.dumps(plan), encoding="utf-8")


def _judge(run_dir) -> tuple[int, dict]:
    res = subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", "--judge", str(run_dir), "--format",
                          "json"], capture_output=True, text=True, timeout=120)
    assert res.returncode in (0, 1), res.stderr
    outcome = json.loads(res.stdout)  # the summary and where the report is (what the MCP tools answer too)
    report = json.loads(Path(outcome["report"]).read_text(encoding="utf-8"))
    assert outcome["summary"]["verdict"] == report["verdict"]
    return res.returncode, report


def test_slowed_overlap_modes_are_never_passed(tmp_path):
    first = run_verification(VerifyOptions(steps=6, micro_batches=2, out=tmp_path / "run"))
    assert first.verdict == "throughput-not-judged", first.summary
    code, same = _judge(tmp_path / "run")  # judged again unchanged: the same verdict
    assert code == 0 and same["verdict"] == first.verdict
    for factor in (1.25, 1.5, 2.0):
        for device in ("cpu", "cuda"):
            run_dir = tmp_path / f"x{factor}-{device}"
            shutil.copytree(tmp_path / "run", run_dir)
            _slow_down(run_dir, factor, device if device == "cuda" else None)
            code, report = _judge(run_dir)
            assert_report_valid(run_dir)
            assert report["verdict"] != "passed", (factor, device, report["summary"])
            tp = next(c for c in report["criteria"] if c["id"] == "throughput")
            assert tp["status"] in ("fail", "inconclusive"), tp["summary"]
            assert "all success criteria met" not in report["summary"]
            if device == "cpu":
                assert report["verdict"] == "throughput-not-judged" and not tp["judged"]
                assert report["summary"].startswith("throughput not judged")
            else:
                assert report["verdict"] in ("failed", "inconclusive") and tp["judged"] and code == 1


def test_steps_extend_until_throughput_is_settled_or_the_limit(tmp_path):
    """--max-steps: all modes keep stepping together past --steps while an outcome is inconclusive."""
    report = run_verification(VerifyOptions(steps=3, max_steps=5, micro_batches=2, modes=["baseline", "overlap"],
                                            out=tmp_path / "run"))
    counts = {r.mode: len(r.steps) for r in report.runs}
    assert len(set(counts.values())) == 1 and 3 <= counts["baseline"] <= 5, counts
    assert all(r.status == "completed" for r in report.runs)
    extended = [n for n in report.notes if n.startswith("throughput not settled after 3 steps")]
    assert bool(extended) == (counts["baseline"] > 3)
    assert "--max-steps 5" in report.command
    code, again = _judge(tmp_path / "run")  # the same folder judges the same
    assert again["verdict"] == report.verdict and code == 0
