"""The estimator's work is bounded (issue 15): every count has a maximum, every rate a range, and the 1f1b
timeline's steady-state shortcut gives what simulating every micro-batch gives."""

from __future__ import annotations

import json
import math
import random

import pytest

from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.model import MAX_LAYERS, MAX_MICRO_BATCHES
from moe_overlap.skill.estimate.timeline import NodeTimes, one_f_one_b_timeline

BASE = dict(hidden=4096, moe_ffn=2048, experts=64, topk=8, tokens=4096, ep=8, fabric="h100-nvlink",
            gpu_preset="h100")


@pytest.mark.parametrize("seed", range(90))
def test_steady_state_shortcut_matches_the_full_simulation(seed):
    rnd = random.Random(seed)
    n = NodeTimes(*[rnd.choice([0.0, rnd.random(), 10 * rnd.random()]) for _ in range(11)])
    layers, mbs, delay = rnd.randint(1, 5), rnd.randint(1, 40), rnd.random() < 0.5
    wave = rnd.choice([0.0, 0.77, rnd.random()])  # with the second wave too (Timeline.wave)
    fast = one_f_one_b_timeline(n, layers, mbs, delay, second_wave=wave)
    full = one_f_one_b_timeline(n, layers, mbs, delay, extrapolate=False, second_wave=wave)
    for a, b in ((fast.makespan, full.makespan), (fast.busy["compute"], full.busy["compute"]),
                 (fast.busy["comm"], full.busy["comm"])):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9)


def test_the_largest_request_allowed_is_cheap():
    result = estimate_overlap_benefit(parse_request({**BASE, "layers": MAX_LAYERS, "micro_batches": MAX_MICRO_BATCHES}))
    assert all(math.isfinite(s.step_ms) for s in result.schedules)


@pytest.mark.parametrize("field,value", [("layers", 100_000), ("micro_batches", 10**8), ("chunks", 10**8),
                                         ("hidden", 10**30), ("tokens", 2**70), ("tflops", 1e-300),
                                         ("intra_gbps", 1e300), ("attn_ms", 1e300), ("tflops", float("inf")),
                                         ("other_ms", float("nan"))])
def test_out_of_range_values_are_refused_naming_the_field(field, value):
    with pytest.raises(EstimateError) as err:
        parse_request({**BASE, field: value})
    assert err.value.field == field and len(str(err.value)) < 400


def test_extreme_but_allowed_values_give_strict_json():
    for extreme in ({"tflops": 1e-6, "intra_gbps": 1e-6, "mem_gbps": 1e-6, "hidden": 1 << 20, "moe_ffn": 1 << 20,
                     "tokens": 1 << 24, "topk": 64, "layers": MAX_LAYERS, "micro_batches": MAX_MICRO_BATCHES},
                    {"tflops": 1e6, "intra_gbps": 1e6, "hidden": 1, "moe_ffn": 1, "tokens": 1, "topk": 1}):
        result = estimate_overlap_benefit(parse_request({**BASE, **extreme}))
        json.dumps(result.model_dump(mode="json"), allow_nan=False)
