"""Where the time of one MoE layer goes: torch.profiler traces and host profiles, every schedule, any EP size.

    python benchmarks/gpu/profile_layer.py --device cuda --world 2 --out $OUT        # NCCL, one GPU per rank
    python benchmarks/gpu/profile_layer.py --device cuda --world 1 --out $OUT        # EP 1: no communication
    python benchmarks/gpu/profile_layer.py --device cpu --preset tiny                 # gloo smoke run

Per preset, in every rank (the layer and the regions of benchmarks/gpu/ep_overlap_body.py: MoELayer ``none``
forward + backward; ``nodes``, the 1F1B node functions run one after the other; ``1f1b`` and
``1f1b+wgrad``, one layer pair of forward k+1 with backward k): warm-up, then

  * a host profile (cProfile) of 10 iterations of each region on rank 0: the Python functions that
    cost host time (what makes a layer host-bound);
  * a torch.profiler trace (CPU + CUDA) of 3 iterations of each region on every rank, summarised by
    benchmarks/gpu/trace_summary.py (stream busy and idle time, the longest compute-stream gaps with the host
    call that ended them, blocking calls, NCCL time beside compute); rank 0's trace is written to
    ``--out`` as ``trace_<preset>_r<world>.json.gz`` (open it in Perfetto or chrome://tracing).

``--fabric`` (moe_overlap/ep/fabric.py) picks the NCCL transport of every rank (``emulated-net``: NCCL's
network transport over loopback, P2P and shared memory off). Writes ``profile_<device>_r<world>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and moe_overlap from this checkout, however started

from benchmarks.gpu.ep_overlap import NVLS_OFF, PRESETS, machine_info  # noqa: E402
from benchmarks.gpu.trace_summary import table  # noqa: E402

GPU_PRESETS = ("qwen3-30b-a3b", "dsv3-proxy")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--world", type=int, default=None, help="EP size = ranks (default: all GPUs; 2 on CPU)")
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS))
    ap.add_argument("--fabric", default="native", help="native | emulated-net (moe_overlap/ep/fabric.py)")
    ap.add_argument("--a2a", default="nccl", help="all-to-all backend: nccl | ce | auto (moe_overlap/ep/transport.py)")
    ap.add_argument("--ffn", type=int, default=None,
                    help="expert ffn size for every preset (required for a 'balanced' preset: its ffn is chosen by "
                         "ep_overlap.py's run, e.g. 14208 in benchmarks/results/h200x2_2026-11-29_r4)")
    ap.add_argument("--timeout", type=float, default=400)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    import torch

    from moe_overlap.ep.fabric import fabric_env
    from moe_overlap.verify.run.ranks import spawn_ranks

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    names = args.preset or (list(GPU_PRESETS) if args.device == "cuda" else ["tiny"])
    shapes = [(n, dict(PRESETS[n], **({"ffn": args.ffn} if args.ffn else {}))) for n in names]
    unresolved = [n for n, s in shapes if not isinstance(s["ffn"], int)]
    if unresolved:
        print(f"--preset {unresolved[0]}: its ffn is chosen per run ({PRESETS[unresolved[0]]['ffn']!r}); "
              "pass --ffn N (the value ep_overlap.py printed for this fabric)", file=sys.stderr)
        return 2
    for k, v in {**NVLS_OFF, **fabric_env(args.fabric)}.items():  # inherited by every spawned rank
        os.environ[k] = v
    args.out.mkdir(parents=True, exist_ok=True)
    from benchmarks.gpu.profile_body import profile_body

    per_rank = spawn_ranks(profile_body, world, (shapes, args.device, str(args.out),
                                                 args.a2a),
                           backend="nccl" if args.device == "cuda" else "gloo", timeout=args.timeout,
                           pass_group=True)
    doc = {"command": "python benchmarks/gpu/profile_layer.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {**machine_info(args.device), "gpu": per_rank[0]["gpu"]},
           "versions": {"python": platform.python_version(), **per_rank[0]["versions"]},
           "world": world, "fabric": args.fabric, "a2a": args.a2a, "ranks": per_rank}
    out = args.out / f"profile_{args.device}_r{world}{'' if args.fabric == 'native' else '_' + args.fabric}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    for preset in per_rank[0]["presets"]:
        print(f"\n## {preset['preset']}, EP {world}, fabric {args.fabric}, a2a {args.a2a} (rank 0; every rank in the JSON)")
        print(table(preset["summary"]))
        for region, s in preset["summary"].items():
            gaps = "; ".join(f"{g['ms']:.3f} ms at +{g['start_us'] / 1e3:.2f} ms ended by {g['host_call_at_end']}"
                             for g in s["top_gaps"][:3])
            print(f"  {region}: longest compute gaps: {gaps or '-'}; blocking: {s['host']['blocking_names']}")
        print("  host hot spots (cProfile tottime ms per iteration, rank 0):")
        for region, rows in preset["host_profile"].items():
            print(f"    {region}: " + "; ".join(f"{r['function']} {r['tottime_ms']:.3f}" for r in rows[:8]))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
