"""The GEMMs' second wave beside an SM-driven all-to-all in the estimator's 1f1b timeline (Timeline.wave)."""

from __future__ import annotations

import pytest

from moe_overlap.skill.estimate import costs
from moe_overlap.skill.estimate.api import estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.timeline import Timeline

BASE = dict(hidden=4096, moe_ffn=2048, experts=64, topk=8, tokens=4096, ep=8, fabric="h100-nvlink",
            gpu_preset="h100", micro_batches=8, megatron_host=False)


def test_a_gemm_started_beside_an_all_to_all_waits_for_its_sms():
    tl = Timeline(wave=0.5)
    tl.add("comm", 4.0)  # in flight 0-4
    assert tl.gemm(10.0) == pytest.approx(10.0 + 0.5 * 4.0)  # late blocks start when the all-to-all ends
    assert tl.busy["compute"] == 10.0  # the stretch is not work: serial stays the sum of own times
    tl2 = Timeline(wave=0.5)
    tl2.add("comm", 40.0)
    assert tl2.gemm(10.0) == pytest.approx(15.0)  # at most the GEMM's own time: an early block's share


def test_an_all_to_all_ready_when_the_gemm_starts_stretches_it_whichever_was_added_first():
    tl = Timeline(wave=0.5)
    g = tl.gemm(10.0)
    assert g == 10.0
    tl.add("comm", 4.0)  # added after, starts at 0 with the GEMM: the comm stream's priority wins the SMs
    assert tl.free["compute"] == pytest.approx(12.0)
    later = Timeline(wave=0.5)
    later.gemm(10.0)
    later.add("comm", 4.0, 3.0)  # starts mid-GEMM: the GEMM already holds every SM, no stretch
    assert later.free["compute"] == 10.0


def test_a_task_after_a_gemm_stretched_later_waits_for_the_stretched_end():
    """The GEMM's end that gemm() returned moves when an all-to-all added after it starts beside it: a task that
    depends on that end (the backward dispatch of dgrad's output) starts at the stretched end, not the first one."""
    tl = Timeline(wave=0.5)
    tl.add("compute", 1.0)
    g = tl.gemm(10.0, 1.0)  # 1-11
    tl.add("comm", 4.0, 0.5)  # 0.5-4.5, ready before the GEMM started: stretched by 0.5 x 3.5
    assert tl.free["compute"] == pytest.approx(12.75)
    assert tl.add("comm", 1.0, g) == pytest.approx(13.75)
    assert tl.add("compute", 1.0, g) == pytest.approx(13.75)
    tl.shift(100.0)  # the steady-state jump moves the mapping with the streams
    assert tl.moved[g + 100.0] == pytest.approx(112.75)


def test_without_a_wave_gemm_is_add():
    tl = Timeline()
    tl.add("comm", 4.0)
    assert tl.gemm(10.0) == 10.0


@pytest.mark.parametrize("extra, wave", [({}, costs.SECOND_WAVE),
                                         ({"a2a_engine": "copy-engine"}, 0.0),
                                         ({"dispatcher": "hybridep"}, 0.0),
                                         ({"sm_margin": 8}, 0.0),
                                         ({"overlap_efficiency": 0.6}, 0.0)])
def test_which_requests_get_the_second_wave(extra, wave):
    """SM-driven all-to-alls on a link preset's efficiency; not copy engines, copy-like backends, an SM margin,
    or a given / calibrated efficiency (a blend measured with its run's contention)."""
    res = estimate_overlap_benefit(parse_request({**BASE, **extra}))
    assert res.hardware.second_wave == wave


def test_the_second_wave_costs_the_overlap():
    res = estimate_overlap_benefit(parse_request(BASE))
    ce = estimate_overlap_benefit(parse_request({**BASE, "a2a_engine": "copy-engine", "overlap_efficiency": 1.0}))
    nccl = estimate_overlap_benefit(parse_request({**BASE, "overlap_efficiency": 1.0}))
    # same efficiency: the given one switches the wave off, so only the preset path pays it
    assert {s.name: s.step_ms for s in ce.schedules} == pytest.approx({s.name: s.step_ms for s in nccl.schedules})
    one = {s.name: s for s in res.schedules}
    assert one["1f1b"].step_ms > {s.name: s for s in nccl.schedules}["1f1b"].step_ms
