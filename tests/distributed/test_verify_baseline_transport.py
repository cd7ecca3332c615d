"""`--a2a auto`: the baseline takes the faster transport alone, the overlap modes keep auto's, and report.json
names both with the times. On CPU ranks the two transports are faked by gloo plus a fixed delay
(verify/run/baseline_transport.py, FAKE_ENV), so which one is faster is known in advance."""

from __future__ import annotations

import json

import pytest
import torch

from moe_overlap.verify.api import run_verification
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.run import baseline_transport as bt
from tests.distributed._spawn import run_ranks

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("fake", "want"), [("nccl=0,ce=0.03", "nccl"), ("nccl=0.03,ce=0", "ce")])
def test_baseline_runs_over_the_faster_transport(tmp_path, monkeypatch, fake, want):
    monkeypatch.setenv(bt.FAKE_ENV, fake)
    report = run_verification(VerifyOptions(steps=2, micro_batches=1, a2a="auto", explain=False,
                                            out=tmp_path / "run"))
    assert report.verdict == "throughput-not-judged", report.summary
    env = json.loads((tmp_path / "run" / "report.json").read_text())["environment"]
    assert env["baseline_transport"].startswith(f"{want}: the faster alone"), env
    assert env["a2a_transport"].startswith("auto: fake ce"), env  # the overlap modes: what auto picks on one host
    times = env["a2a_alone_ms"]
    assert set(times) == {"nccl", "ce"}
    slow = "ce" if want == "nccl" else "nccl"
    assert times[slow] - times[want] > 20  # the injected 30 ms, seen by both ranks alike
    assert "the baseline's:" in (tmp_path / "run" / "report.md").read_text()
    loss = next(c for c in report.criteria if c.id == "loss-trajectory")
    assert loss.status == "pass"  # the transports change where bytes go, never the numbers


def test_without_auto_every_mode_shares_the_transport(tmp_path):
    report = run_verification(VerifyOptions(steps=2, micro_batches=1, explain=False, out=tmp_path / "run"))
    env = report.environment
    assert env.a2a_alone_ms is None and env.baseline_transport.startswith("the overlap modes'"), env


def _choose(rank: int, world: int, group) -> dict:
    cands = bt.fake_candidates(group, "slow=0.02,fast=0,tie=0")
    name, _t, times = bt.choose_baseline(cands, group, group, torch.device("cpu"), rows=64, hidden=8,
                                         dtype=torch.float32, iters=3)
    return {"name": name, "times": times}


def test_every_rank_makes_the_same_choice():
    results = run_ranks(_choose, 2)
    assert results[0] == results[1]  # the times are the slowest rank's: every rank holds the same numbers
    assert results[0]["name"] in ("fast", "tie") and results[0]["times"]["slow"] > 15
