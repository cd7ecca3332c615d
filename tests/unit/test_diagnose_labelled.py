"""diagnose on texts from upstream threads (tests/data/diagnose_labelled.yaml): top-1 right on >= 90% of the texts
that have an EP-overlap failure mode, "not an EP-overlap failure" on >= 90% of the rest, at the calibrated
threshold; and the threshold in use is the one the calibration picks."""

from pathlib import Path

import pytest

from moe_overlap.skill.diagnose import api, calibration
from moe_overlap.skill.diagnose.modes import mode_set

LABELLED = Path(__file__).resolve().parents[1] / "data" / "diagnose_labelled.yaml"


@pytest.fixture(scope="module")
def texts():
    return calibration.load_labelled(LABELLED)


@pytest.fixture(scope="module")
def scored(texts):
    return calibration.score_all(texts)


def test_the_set_is_large_enough_and_sourced(texts):
    names = {m.name for m in mode_set().modes}
    assert len(texts) >= 40
    assert sum(1 for t in texts if t["expected"] is None) >= 10
    for t in texts:
        assert t["expected"] is None or t["expected"] in names, t
        assert "/" in t["source"] or t["source"].startswith("megatron-core"), t  # repo + issue/PR, or the file
    # the runtime failure modes of the brief each have upstream texts
    covered = {t["expected"] for t in texts}
    for name in ("deepep-dispatch-timeout", "deepep-low-latency-needs-rdma", "hybridep-uneven-token-counts",
                 "hybridep-nvlink-domain-size", "flex-backend-not-installed", "flex-unsupported-gpu",
                 "bridge-perf-flag-cannot-disable-overlap", "shared-event-nccl-order-hang", "no-speedup",
                 "deepep-no-gain-over-alltoall"):
        assert name in covered, name


def test_top1_and_none_rate_at_the_threshold_in_use(scored):
    outcome = calibration.evaluate(scored, api.THRESHOLD)
    wrong = [(s.source, s.expected, s.top, round(s.top_raw, 2)) for s in scored
             if (s.expected and (s.top != s.expected or s.top_raw < api.THRESHOLD))
             or (not s.expected and s.top_raw >= api.THRESHOLD)]
    assert outcome.accuracy >= 0.9, wrong
    assert outcome.none_rate >= 0.9, wrong


def test_threshold_in_use_is_the_calibrated_one(scored):
    chosen, outcomes = calibration.sweep(scored)
    assert api.THRESHOLD == pytest.approx(chosen), (chosen, [(o.threshold, o.accuracy, o.none_rate) for o in outcomes])


def test_results_say_the_verdict(texts):
    for t in texts:
        r = api.diagnose(t["text"])
        if r.matches:
            assert r.verdict == "ep-overlap-failure" and r.not_ep_overlap is None
            assert r.matches[0].sources, r.matches[0].failure_mode  # every answer names its upstream sources
        else:
            assert r.verdict == "not-an-ep-overlap-failure" and r.not_ep_overlap.what_to_do


def test_unrelated_errors_name_what_they_look_like():
    cases = {
        "torch.AcceleratorError: CUDA error: an illegal memory access was encountered": "cuda-illegal-memory-access",
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, NumelIn=1, "
        "NumelOut=1, Timeout(ms)=600000) ran for 600013 milliseconds before timing out.": "nccl-timeout-or-error",
        "RuntimeError: DataLoader worker (pid 2637) is killed by signal: Killed.": "data-loader",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB": "cuda-out-of-memory",
        "the coffee machine is broken": "unrecognised",
    }
    for text, kind in cases.items():
        r = api.diagnose(text)
        assert r.verdict == "not-an-ep-overlap-failure" and r.matches == [], (text, r.matches)
        assert r.not_ep_overlap.kind == kind and r.hint.startswith("not an EP-overlap failure")


def test_the_same_errors_with_ep_overlap_evidence_are_diagnosed():
    r = api.diagnose("RuntimeError: DeepEP error: timeout (dispatch CPU)\nWatchdog caught collective operation "
                     "timeout: WorkNCCL(SeqNum=9, OpType=ALLTOALL_BASE)")
    assert r.matches[0].failure_mode == "deepep-dispatch-timeout"
    r = api.diagnose("CUDA out of memory after turning on overlap_moe_expert_parallel_comm with the same batch")
    assert r.matches[0].failure_mode == "out-of-memory-after-enabling"
