"""Faults: a perturbed mode fails the loss criterion; a crash, a hang, a cancel and Ctrl-C each give their
verdict, a report valid against the schema, and no process left behind."""

from __future__ import annotations

import os
import subprocess
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
    processes_with_token,
)

pytestmark = pytest.mark.slow


_LONG_RUN = [sys.executable, "-m", "moe_overlap.cli", "verify", "--steps", "50", "--micro-batches", "2",
             "--modes", "baseline,overlap"]


def re_line(path_part, func_part, text):
    """A faulthandler frame line `File ".../<path_part>", line N in <func>` is present."""
    return any(path_part in line and func_part in line for line in text.splitlines())


def _crit(report, cid):
    return next(c for c in report.criteria if c.id == cid)


def test_perturbed_mode_fails_loss_criterion(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    report = run_verification(VerifyOptions(steps=3, micro_batches=2, out=tmp_path, inject_fault="perturb:overlap"))
    assert report.verdict == "failed"
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)
    comps = {c["mode"]: c for c in _crit(report, "loss-trajectory").evidence["comparisons"]}
    assert not comps["overlap"]["within_tolerance"] and not comps["overlap"]["bitwise_equal"]
    assert comps["overlap"]["first_step_over_tolerance"] == 1  # same init: step 0 agrees, the update differs
    assert comps["overlap+wgrad"]["within_tolerance"]
    assert _crit(report, "completes-cleanly").status == "pass"


def test_crash_reports_rank_traceback(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    report = run_verification(VerifyOptions(steps=3, micro_batches=2, modes=["baseline", "overlap"], out=tmp_path,
                                            inject_fault="crash:1:overlap:1"))
    assert report.verdict == "crashed"
    assert report.failure.rank == 1
    assert "InjectedFault" in report.failure.traceback
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)
    runs = {r.mode: r for r in report.runs}
    # The modes interleave step by step: both ran step 0, the baseline also step 1, then rank 1 raised.
    assert len(runs["baseline"].steps) == 2 and len(runs["overlap"].steps) == 1
    assert runs["overlap"].status == "incomplete"
    # the traceback also lands in rank 1's overlap training log, where the log check finds it
    problems = _crit(report, "completes-cleanly").evidence["log_checks"]["overlap"]["problems"]
    assert any("rank1.log" in p and "traceback" in p.lower() for p in problems), problems


def test_hang_is_detected_with_stacks(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    t0 = time.monotonic()
    report = run_verification(VerifyOptions(steps=3, micro_batches=2, modes=["baseline", "overlap"], out=tmp_path,
                                            hang_timeout_s=4, inject_fault="hang:1:overlap:1"))
    assert report.verdict == "hang"
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)
    stacks = report.failure.stacks
    assert set(stacks) == {"0", "1"}
    # rank 1 sits in the injected sleep; rank 0 waits in a collective of the next step (ep/ or the loss gather)
    assert re_line("train.py", "in step", stacks["1"])
    assert re_line("train.py", "in step", stacks["0"]) or "moe_overlap/ep/" in stacks["0"]
    assert report.failure.kind == "hang" and "no heartbeat" in report.failure.message
    # detected within the hang timeout plus a few seconds (start-up + the baseline's steps included)
    assert time.monotonic() - t0 < 60


def test_cancel_kills_every_rank(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    cancel = threading.Event()

    def progress(ev):
        if ev["event"] == "step":
            cancel.set()

    options = VerifyOptions(steps=50, micro_batches=2, modes=["baseline", "overlap"], out=tmp_path)
    report = run_verification(options, progress=progress, cancel=cancel)
    assert report.verdict == "cancelled"
    assert_report_valid(tmp_path)
    assert_no_orphans(token, report)


def test_ctrl_c_through_the_cli(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    assert interrupt_cli_run(_LONG_RUN + ["--out", str(tmp_path)], timeout=30) == 130
    data = assert_report_valid(tmp_path)
    assert data["verdict"] == "cancelled"
    time.sleep(0.5)
    assert_no_orphans(token)


def test_launcher_killed_leaves_no_rank(tmp_path, monkeypatch):
    """Even a SIGKILLed launcher (no finally runs) leaves nothing behind: ranks watch their parent."""
    token = new_token(monkeypatch)
    proc = subprocess.Popen(_LONG_RUN + ["--out", str(tmp_path)], stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ))
    seen_step = False
    try:
        for line in proc.stderr:
            if " step " in line:
                seen_step = True
                break
        proc.kill()
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and processes_with_token(token):
        time.sleep(0.2)
    # Without a step the launcher died early: the kill never hit running ranks and proves nothing.
    assert seen_step, "the run never reached a step before the launcher was killed"
    assert_no_orphans(token)
