#!/usr/bin/env python3
"""Calibrate diagnose's "not an EP-overlap failure" threshold on the labelled upstream texts.

    python tools/calibrate_diagnose.py [tests/data/diagnose_labelled.yaml]

Prints, per candidate threshold on the top raw score, the top-1 accuracy on the texts with a failure mode and
the none-rate on the texts without one, the threshold it picks (the middle of the widest interval where the
smaller of the two is highest), and the texts it gets wrong at the threshold in use (api.THRESHOLD).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from moe_overlap.skill.diagnose import api, calibration  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[1] / "tests" / "data" / "diagnose_labelled.yaml"


def main() -> int:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    scored = calibration.score_all(calibration.load_labelled(path))
    chosen, outcomes = calibration.sweep(scored)
    print(f"{len(scored)} texts ({sum(1 for s in scored if s.expected)} with a failure mode) from {path}")
    print("threshold  top-1 right  not-EP right")
    for o in outcomes:
        print(f"{o.threshold:9.2f}  {o.answered_right:3d}/{o.answered} {o.accuracy:5.1%}  "
              f"{o.none_right:3d}/{o.none} {o.none_rate:5.1%}")
    now = calibration.evaluate(scored, api.THRESHOLD)
    print(f"chosen threshold {chosen}; in use {api.THRESHOLD}: top-1 {now.accuracy:.1%} "
          f"({now.answered_right}/{now.answered}), not-EP {now.none_rate:.1%} ({now.none_right}/{now.none})")
    for s in scored:
        if (s.expected and (s.top != s.expected or s.top_raw < api.THRESHOLD)) or (
                not s.expected and s.top_raw >= api.THRESHOLD):
            print(f"  wrong: {s.source}: expected {s.expected}, top {s.top} at {s.top_raw:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
