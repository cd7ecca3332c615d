"""The calibration runs end to end on 2 spawned gloo ranks with our own layer (one round: a smoke test of
the probes and the fit, not a performance number)."""

from __future__ import annotations

import math
import subprocess
import sys

from moe_overlap.skill.estimate.api import estimate_overlap_benefit, parse_request
from moe_overlap.skill.estimate.model import Calibration

_CALIBRATE = ("from moe_overlap.verify.calibrate.machine import calibrate; "
              "print(calibrate(backend='gloo', world=2, precision='fp32', rounds=1, timeout_s=300).model_dump_json())")


def test_calibrate_two_gloo_ranks_feeds_the_estimator():
    # In a child process: spawning the ranks starts multiprocessing's resource tracker, which would then live on
    # as a child of the test process and read as a leftover process in tests/mcp/test_cancel.py.
    out = subprocess.run([sys.executable, "-c", _CALIBRATE], capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    cal = Calibration.model_validate_json(out.stdout.strip().splitlines()[-1])
    for name in ("expert_tflops", "dense_tflops", "mem_gbps", "a2a_gbps"):
        value = getattr(cal, name)
        assert value > 0 and math.isfinite(value), (name, value)
    assert 0.0 <= cal.overlap_efficiency <= 1.0
    assert "gloo, 2 ranks" in cal.source
    req = parse_request(dict(hidden=256, moe_ffn=256, experts=8, topk=2, tokens=512, ep=2, precision="fp32",
                             micro_batches=2, calibration=cal.model_dump()))
    result = estimate_overlap_benefit(req)
    assert result.hardware.intra_gbps == cal.a2a_gbps
    assert all(s.step_ms > 0 for s in result.schedules)
