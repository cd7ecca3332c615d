#!/usr/bin/env python3
"""The estimator's second wave and the overlap efficiencies re-derived with it, from the committed files.

    python benchmarks/estimator/second_wave.py        # seconds, torch-free

What it prints:
* ``SECOND_WAVE`` (skill/estimate/costs.py): the median, over shapes and holders, of the expert GEMMs' slowdown
  when they start beside a kernel that holds SMs at SM margin 0, minus 1 (benchmarks/contention/gemm_beside.py on
  one H200, benchmarks/results/h200_2026-12-02_beside/gemm_beside.json);
* the NVLink and network overlap efficiencies (skill/estimate/hardware.py): per shape of the first two-H200
  round's files (hardware.EFFICIENCY_FILES), the 1f1b layer pair's measured gain over the same layer's nodes run
  one after the other, over the gain the model predicts at efficiency 1 with the second wave in its timeline
  (the run's pieces calibrate the model as in estimate_accuracy.py; no host floor: the efficiency is what the
  GPU streams hide); the median per link kind, at most 1;
* the accuracy table's pass counts with the model as it is (estimate_accuracy.py).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.estimator import estimate_accuracy as acc  # noqa: E402
from moe_overlap.skill.estimate import api, costs, hardware  # noqa: E402
from moe_overlap.skill.estimate.api import parse_request  # noqa: E402
from moe_overlap.skill.estimate.schedules import layer_nodes, schedules  # noqa: E402


def second_wave() -> float:
    """Median over shapes, holder sizes and kinds of the margin-0 slowdown beside an in-flight kernel, minus 1."""
    res = json.loads((ROOT / costs.SECOND_WAVE_FILE).read_text(encoding="utf-8"))
    return statistics.median(row["margin_0"]["slowdown"] for r in res["shapes"].values()
                             for row in r["beside"].values()) - 1.0


def rederived() -> dict[str, list[float]]:
    """Per link kind ("nvlink", "network"), per shape of hardware.EFFICIENCY_FILES: measured 1f1b gain over the
    model's at efficiency 1 (both against the nodes run one after the other, ms per layer and micro-batch)."""
    out: dict[str, list[float]] = {"nvlink": [], "network": []}
    for name in hardware.EFFICIENCY_FILES:
        data = json.loads((ROOT / name).read_text(encoding="utf-8"))
        fabric, a2a = data.get("fabric") or "native", data.get("a2a") or "nccl"
        for p in data["presets"]:
            rows = {r["schedule"]: r for r in p["rows"]}
            req = acc._request(acc.shape_of(p), int(data["world"]), fabric, a2a, rows, p["alone"])
            r = api.check_request(parse_request(dict({k: v for k, v in req.items() if k != "host_ms"},
                                                     megatron_host=False)))
            h = api._hardware(r, r.ep > api.ep_per_node(r))  # the preset's second wave, at efficiency 1 below
            s = {x.name: x for x in schedules(r, h, layer_nodes(api._per_layer(r, h)), 1.0)}
            predicted = (s["none"].step_ms - s["1f1b"].step_ms) / acc.PAIRS
            measured = rows["nodes"]["total_ms"] - rows["1f1b"]["total_ms"]
            out["network" if fabric != "native" else "nvlink"].append(measured / predicted)
    return out


def efficiencies(per: dict[str, list[float]]) -> dict[str, float]:
    return {k: min(1.0, round(statistics.median(v), 2)) for k, v in per.items()}


def main() -> int:
    print(f"second wave (median margin-0 slowdown - 1, {costs.SECOND_WAVE_FILE}): {second_wave():.3f} "
          f"(costs.SECOND_WAVE {costs.SECOND_WAVE})")
    per = rederived()
    effs = efficiencies(per)
    used = {"nvlink": hardware.NVLINK_OVERLAP_EFFICIENCY, "network": hardware.NETWORK_OVERLAP_EFFICIENCY}
    for k, v in per.items():
        print(f"{k} efficiency: {', '.join(f'{x:.3f}' for x in v)} -> median {effs[k]:.2f}, at most 1 "
              f"(hardware.py: {used[k]})")
    pub, ours = acc.public_rows(), acc.our_rows()
    print(f"accuracy table: public anchors {sum(r['passes'] for r in pub)} of {len(pub)}, our EP 2 rows "
          f"{sum(r['passes'] for r in ours)} of {len(ours)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
