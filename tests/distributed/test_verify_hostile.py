"""Issue 15 on real runs: `kill -9` / SIGSTOP of rank r names rank r; a double Ctrl-C still leaves a report;
a re-run into a killed run's folder never reports from its stale records."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time

import pytest

from moe_overlap.verify.api import run_verification
from moe_overlap.verify.plan.options import VerifyOptions
from tests.distributed._verify_util import (
    assert_no_orphans,
    assert_report_valid,
    interrupt_cli_run,
    new_token,
)

pytestmark = pytest.mark.slow

_LONG = dict(steps=200, micro_batches=2, modes=["baseline", "overlap"])


def _pid_after_a_step(out, rank: int, timeout: float = 120) -> int:
    """The pid of `rank` once it has recorded a step (the ranks are up and talking)."""
    path = out / "ranks" / f"rank{rank}.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            records = [json.loads(x) for x in path.read_text().splitlines() if x.strip().endswith("}")]
            if any(r.get("kind") == "step" for r in records):
                return next(r["pid"] for r in records if r.get("kind") == "hello")
        time.sleep(0.1)
    raise AssertionError(f"rank {rank} never reached a step")


def _run_in_thread(options: VerifyOptions) -> tuple[threading.Thread, dict]:
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("report", run_verification(options)))
    thread.start()
    return thread, box


@pytest.mark.parametrize("victim", [1, 0])
def test_kill_9_of_rank_r_names_rank_r(tmp_path, monkeypatch, victim):
    token = new_token(monkeypatch)
    thread, box = _run_in_thread(VerifyOptions(**_LONG, out=tmp_path))
    os.kill(_pid_after_a_step(tmp_path, victim), signal.SIGKILL)
    thread.join(120)
    report = box["report"]
    assert report.verdict == "crashed" and report.failure.rank == victim, report.failure
    assert "SIGKILL" in report.failure.message
    ranks = {r["rank"]: r for r in
             next(c for c in report.criteria if c.id == "completes-cleanly").evidence["launch"]["ranks"]}
    assert ranks[victim]["state"] == "killed" and ranks[victim]["signal"] == "SIGKILL"
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)


@pytest.mark.parametrize("victim", [1, 0])
def test_sigstop_of_rank_r_names_rank_r(tmp_path, monkeypatch, victim):
    token = new_token(monkeypatch)
    thread, box = _run_in_thread(VerifyOptions(**_LONG, out=tmp_path, hang_timeout_s=5))
    pid = _pid_after_a_step(tmp_path, victim)
    os.kill(pid, signal.SIGSTOP)
    try:
        thread.join(120)
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    report = box["report"]
    assert report.verdict == "hang" and report.failure.rank == victim, report.failure
    assert "stopped" in report.failure.message
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)


def test_rerun_into_a_killed_runs_folder_does_not_read_its_records(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    thread, box = _run_in_thread(VerifyOptions(**_LONG, out=tmp_path))
    os.kill(_pid_after_a_step(tmp_path, 1), signal.SIGKILL)
    thread.join(120)
    assert box["report"].verdict == "crashed"
    (tmp_path / "mine.txt").write_text("keep\n")
    report = run_verification(VerifyOptions(steps=3, micro_batches=2, modes=["baseline", "overlap"], out=tmp_path,
                                            force=True))
    assert report.verdict in ("passed", "throughput-not-judged"), report.summary
    assert (tmp_path / "mine.txt").read_text() == "keep\n"
    records = (tmp_path / "ranks" / "rank1.jsonl").read_text().splitlines()
    assert not any(json.loads(x)["kind"] == "error" for x in records)
    assert_no_orphans(token, report)


def test_double_ctrl_c_still_leaves_a_report(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    cmd = [sys.executable, "-m", "moe_overlap.cli", "verify", "--steps", "200", "--micro-batches", "2", "--modes",
           "baseline,overlap", "--out", str(tmp_path)]
    assert interrupt_cli_run(cmd, presses=5) == 130  # impatient: four more, quickly
    data = assert_report_valid(tmp_path)
    assert data["verdict"] == "cancelled"
    time.sleep(0.5)
    assert_no_orphans(token)
