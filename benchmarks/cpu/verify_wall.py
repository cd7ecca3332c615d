#!/usr/bin/env python3
"""How long a default verification run takes, seen from the user's shell (the figure README and docs/mcp.md quote).

    python benchmarks/cpu/verify_wall.py [--repeats 3] [--out benchmarks/results/verify_wall_cpu.json]

Cases: `moe-overlap verify` as `make setup` runs it (embedded default config, 2 CPU ranks, 3 modes) and the
same with `--steps 2` (the shortest run the MCP tool accepts). Each repeat is a fresh process; the wall
clock runs from the launch to the exit (interpreter start, imports, rank start-up, training, report), and
`report.json`'s own `elapsed_s` is kept beside it. Cases are interleaved repeat by repeat.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = {"default (make setup)": [], "--steps 2": ["--steps", "2"]}


def _one(extra: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "moe_overlap.cli", "verify", "--out", str(out), "--force", *extra]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode not in (0, 1):  # 1 is a verdict (e.g. a noisy throughput warning), not a crash
        raise SystemExit(f"verify exited {proc.returncode}: {proc.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    return {"wall_s": round(wall, 2), "report_elapsed_s": round(report["elapsed_s"], 2),
            "verdict": report["verdict"], "steps_per_mode": report["config"]["steps"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "verify_wall_cpu.json"))
    args = ap.parse_args()
    load_before = list(os.getloadavg())
    samples: dict[str, list[dict]] = {name: [] for name in CASES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for name, extra in CASES.items():
                samples[name].append(_one(extra, Path(tmp) / "run"))
    rows = []
    for name, runs in samples.items():
        walls = [r["wall_s"] for r in runs]
        rows.append({"case": name, "steps_per_mode": runs[0]["steps_per_mode"], "runs": len(runs),
                     "wall_min_s": min(walls), "wall_median_s": statistics.median(walls), "wall_max_s": max(walls),
                     "report_elapsed_median_s": statistics.median(r["report_elapsed_s"] for r in runs),
                     "verdicts": sorted({r["verdict"] for r in runs}), "samples": runs})
    result = {
        "command": "python benchmarks/cpu/verify_wall.py" + (f" --repeats {args.repeats}" if args.repeats != 3 else ""),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "load_average_before": load_before,
                    "load_average_after": list(os.getloadavg()), "note": "a high load average means CPU cores shared with other jobs"},
        "versions": {"python": platform.python_version(), "torch": metadata.version("torch")},
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print("| case | steps per mode | runs | wall min s | wall median s | wall max s | report elapsed median s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['steps_per_mode']} | {r['runs']} | {r['wall_min_s']:.1f} | {r['wall_median_s']:.1f} "
              f"| {r['wall_max_s']:.1f} | {r['report_elapsed_median_s']:.1f} |")
    print(f"load average before {load_before[0]:.2f}, after {result['machine']['load_average_after'][0]:.2f}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
