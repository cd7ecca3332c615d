"""Expert-parallel overlap benchmark: one MoE layer at production shapes, every schedule, and the
all-to-all and expert compute alone, all from one run, so overlap efficiency needs nothing else.

    python benchmarks/gpu/ep_overlap.py --device cuda --world 8          # NCCL, one GPU per rank, bf16
    python benchmarks/gpu/ep_overlap.py --device cpu --preset tiny       # gloo smoke run (2 ranks, seconds)

EP = world size: each rank holds E / world experts and T = 4096 tokens (top-8, forced-balanced routing,
so timings do not depend on routing skew). What each row times: benchmarks/gpu/ep_overlap_body.py.

    overlap efficiency = (T_ref - T_overlap) / min(T_comm, T_compute)
      T_ref      none (MoELayer) for chunked; nodes (the same node functions run sequentially) for 1f1b
      T_comm     the four all-to-alls of one forward + backward (dispatch, combine, and their gradients)
      T_compute  the expert GEMMs of one forward + backward (forward, dgrad, wgrad)
    1.0 = the shorter of the two fully hidden; <= 0 = no gain. All times fwd+bwd, medians over rounds
    of the slowest rank.

The dsv3-proxy preset is Megatron-Core's single-layer figure shape (Megatron-LM's MoE performance baseline,
"moe_perf"; the card's evidence `megatron-moe-perf-baseline`: 4096 tokens,
hidden 7168, ffn 2048, 32 experts, top-8, EP8, alltoall, 8xH100: 7.12 ms fwd / 10.48 ms bwd, no overlap);
the JSON sets it next to ours and says whether the world size matches (EP8) and that ours is H200.

Every rank needs NVLink multicast off (the device machines' rule): this script sets NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 before spawning (when unset) and each rank
checks them. Writes benchmarks/results/ep_overlap_<device>_r<world>.json (or --out).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

PRESETS = {
    "qwen3-30b-a3b": dict(tokens=4096, hidden=2048, ffn=768, experts=128, topk=8),
    "deepseek-v3": dict(tokens=4096, hidden=7168, ffn=2048, experts=256, topk=8),
    "dsv3-proxy": dict(tokens=4096, hidden=7168, ffn=2048, experts=32, topk=8),
    # CPU smoke shape: seconds on 2 gloo ranks; exercises every code path, says nothing about speed.
    "tiny": dict(tokens=64, hidden=32, ffn=16, experts=8, topk=2),
    # The Qwen3 expert shape with the ffn size that puts the experts' compute at half the all-to-alls' time
    # on the fabric at hand (measured from ffn_base in the same run; ep_overlap_body.balanced_ffn; --ffn
    # fixes it instead): the communication-bound regime of a multi-node run, where overlap can hide the most.
    "balanced": dict(tokens=2048, hidden=2048, ffn="balanced", ffn_base=768, experts=16, topk=8),
    "tiny-balanced": dict(tokens=64, hidden=32, ffn="balanced", ffn_base=16, experts=8, topk=2),
}
GPU_PRESETS = ("qwen3-30b-a3b", "deepseek-v3", "dsv3-proxy")
MEGATRON_PROXY = {"fwd_ms": 7.12, "bwd_ms": 10.48, "world": 8, "gpu": "8xH100", "dispatcher": "alltoall",
                  "overlap": False, "source": "Megatron-LM moe_perf baseline (DSv3 proxy); card evidence megatron-moe-perf-baseline"}
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
COMM_KEYS = ("alone/a2a dispatch", "alone/a2a combine", "alone/a2a grad-combine", "alone/a2a grad-dispatch")


NONES = ("none", "none-nccl")  # the sequential layer over each transport measured: the baseline is the fastest


def _med(times, key) -> float:
    return times[key]["median_ms"]


def derive(res: dict, chunk_list: list[int], margins: list[int] = ()) -> dict:
    """Rows (fwd, bwd, total, speedup, efficiency) and the alone pieces from one preset's medians."""
    t = res["times"]
    comm_fwd = _med(t, COMM_KEYS[0]) + _med(t, COMM_KEYS[1])
    comm_bwd = _med(t, COMM_KEYS[2]) + _med(t, COMM_KEYS[3])
    comp_fwd = _med(t, "alone/experts fwd")
    comp_bwd = _med(t, "alone/experts dgrad") + _med(t, "alone/experts wgrad")
    alone = {"comm_fwd_ms": comm_fwd, "comm_bwd_ms": comm_bwd, "comm_ms": comm_fwd + comm_bwd,
             "compute_fwd_ms": comp_fwd, "compute_bwd_ms": comp_bwd, "compute_ms": comp_fwd + comp_bwd,
             "count_exchange_ms": _med(t, "alone/count exchange"),
             **{k.split("/")[1].replace(" ", "_") + "_ms": _med(t, k) for k in COMM_KEYS}}
    hideable = min(alone["comm_ms"], alone["compute_ms"])
    rows = []

    def host_ms(name):  # host issue time of the row's timed calls (median per call), None in older files
        keys = [f"{name}/pair"] if f"{name}/pair" in t else [f"{name}/fwd", f"{name}/bwd"]
        return sum(t[f"{k}#host"]["median_ms"] for k in keys) if all(f"{k}#host" in t for k in keys) else None

    def row(name, ref, fwd, bwd, total, impl):
        r = {"schedule": name, "impl": impl, "fwd_ms": fwd, "bwd_ms": bwd, "total_ms": total, "reference": ref,
             "host_ms": host_ms(name)}
        if rows:  # the user's overlap-off run: the fastest `none` row (ratios.py folds in a same-call partner)
            r["speedup_vs_fastest_none"] = min(x["total_ms"] for x in rows if x["schedule"] in NONES) / total
        if ref is not None:
            ref_total = next(x["total_ms"] for x in rows if x["schedule"] == ref)
            r["speedup_vs_reference"] = ref_total / total
            if ref == "nodes":  # the same node functions in sequence: what the overlap hid, not a user's speedup
                r["speedup_vs_nodes"] = r["speedup_vs_reference"]
                r["reference_role"] = "diagnostic"

            r["overlap_efficiency"] = (ref_total - total) / hideable
            ref_row = next(x for x in rows if x["schedule"] == ref)
            if fwd is not None:  # per direction, against that direction's own hideable time
                r["fwd_efficiency"] = (ref_row["fwd_ms"] - fwd) / min(comm_fwd, comp_fwd)
                r["bwd_efficiency"] = (ref_row["bwd_ms"] - bwd) / min(comm_bwd, comp_bwd)
        rows.append(r)

    def fb(key):
        f, b = _med(t, f"{key}/fwd"), _med(t, f"{key}/bwd")
        return f, b, f + b

    row("none", None, *fb("none"), "MoELayer autograd, schedule none")
    if "none-nccl/fwd" in t:  # with copy engines: the same `none` over NCCL, the faster of the two is the baseline
        row("none-nccl", None, *fb("none-nccl"), "MoELayer autograd, schedule none, NCCL's all-to-all")
    for c in chunk_list:
        row(f"chunked:{c}", "none", *fb(f"chunked:{c}"), f"MoELayer autograd, schedule chunked, {c} chunks")
    row("nodes", None, *fb("nodes"), "1F1B node functions run sequentially (one micro-batch fwd, then bwd)")
    pair = "layer_pair: fwd of micro-batch k+1 with bwd of micro-batch k"
    row("1f1b", "nodes", None, None, _med(t, "1f1b/pair"), pair)
    row("1f1b+wgrad", "nodes", None, None, _med(t, "1f1b+wgrad/pair"), pair + ", expert wgrad deferred")
    for m in margins:  # the same pairs, the expert GEMMs leaving m SMs to the all-to-all kernels
        row(f"1f1b sm-{m}", "nodes", None, None, _med(t, f"1f1b sm-{m}/pair"), pair + f", GEMMs leave {m} SMs")
        row(f"1f1b+wgrad sm-{m}", "nodes", None, None, _med(t, f"1f1b+wgrad sm-{m}/pair"),
            pair + f", expert wgrad deferred, GEMMs leave {m} SMs")
    if "1f1b counts-on-data-group/pair" in t:  # EP > 1: the host counts group's share, measured alone
        row("1f1b-devcnt", "nodes", None, None, _med(t, "1f1b counts-on-data-group/pair"),
            pair + ", token counts over the data group on the device (before this round)")
    return {"alone": alone, "hideable_ms": hideable, "rows": rows}


def megatron_comparison(preset: str, world: int, rows: list[dict]) -> dict | None:
    if preset != "dsv3-proxy":
        return None
    none = next(r for r in rows if r["schedule"] == "none")
    best = min(rows, key=lambda r: r["total_ms"])
    return {**MEGATRON_PROXY, "megatron_total_ms": MEGATRON_PROXY["fwd_ms"] + MEGATRON_PROXY["bwd_ms"],
            "ours_none_fwd_ms": none["fwd_ms"], "ours_none_bwd_ms": none["bwd_ms"],
            "ours_best_schedule": best["schedule"], "ours_best_total_ms": best["total_ms"],
            "fwd_ratio_ours_over_megatron": none["fwd_ms"] / MEGATRON_PROXY["fwd_ms"],
            "bwd_ratio_ours_over_megatron": none["bwd_ms"] / MEGATRON_PROXY["bwd_ms"],
            "comparable_world": world == MEGATRON_PROXY["world"],
            "caveat": "ours on H200 (more HBM bandwidth than H100, same NVLink 4 generation); Megatron's on H100; "
                      "an EP other than 8 changes the local experts and the a2a volume"}


def print_preset(p: dict, world: int) -> None:
    s = p["shape"]
    print(f"\n{p['preset']}: T={s['tokens']} D={s['hidden']} F={s['ffn']} E={s['experts']} K={s['topk']}, "
          f"EP{world} ({p['local_experts']} local experts), expert path {p['expert_path']}")
    print(f"{'schedule':<12}{'fwd ms':>9}{'bwd ms':>9}{'fwd+bwd':>9}{'host ms':>9}{'x none':>9}{'x ref':>9}{'eff':>7}"
          f"{'fwd eff':>9}{'bwd eff':>9}  vs")
    for r in p["rows"]:
        def f(v, w=9, d=2):
            return f"{v:>{w}.{d}f}" if v is not None else f"{'-':>{w}}"
        print(f"{r['schedule']:<12}{f(r['fwd_ms'])}{f(r['bwd_ms'])}{f(r['total_ms'])}{f(r.get('host_ms'))}"
              f"{f(r.get('speedup_vs_fastest_none'), 9, 3)}{f(r.get('speedup_vs_reference'), 9, 3)}"
              f"{f(r.get('overlap_efficiency'), 7)}"
              f"{f(r.get('fwd_efficiency'))}{f(r.get('bwd_efficiency'))}  {r['reference'] or ''}")
    a = p["alone"]
    print(f"alone: comm fwd {a['comm_fwd_ms']:.2f} + bwd {a['comm_bwd_ms']:.2f} = {a['comm_ms']:.2f} ms; "
          f"experts fwd {a['compute_fwd_ms']:.2f} + bwd {a['compute_bwd_ms']:.2f} = {a['compute_ms']:.2f} ms; "
          f"count exchange {a['count_exchange_ms']:.2f} ms; {p['bytes_per_dispatch'] / 1e6:.1f} MB per dispatch")
    print("agreement (relative L2, 0 = bitwise): " + "; ".join(f"{k} {v:.1e}"
                                                              for k, v in p["agreement_rel_l2"].items()))
    m = p.get("megatron")
    if m:
        print(f"vs Megatron-Core {m['gpu']} EP{m['world']} alltoall {m['fwd_ms']}/{m['bwd_ms']} ms: ours (none) "
              f"{m['ours_none_fwd_ms']:.2f}/{m['ours_none_bwd_ms']:.2f} ms; fwd+bwd {m['megatron_total_ms']:.2f} vs "
              f"ours best {m['ours_best_total_ms']:.2f} ({m['ours_best_schedule']})"
              f"{'' if m['comparable_world'] else ' (different EP: not comparable)'}")


def markdown(doc: dict) -> str:
    """docs/benchmarks.md tables for one results JSON (one per preset)."""
    def f(v, d=2):
        return "-" if v is None else f"{v:.{d}f}"

    out = [f"EP {doc['world']}, {doc['dtype']}, {doc['machine'].get('gpu') or 'CPU'}, {doc['date']}: "
           f"`{doc['command']}`"]
    for p in doc["presets"]:
        s, a = p["shape"], p["alone"]
        out += ["", f"**{p['preset']}** (T {s['tokens']}, D {s['hidden']}, F {s['ffn']}, E {s['experts']}, "
                f"top-{s['topk']}, {p['local_experts']} local experts): a2a alone {a['comm_ms']:.2f} ms, experts "
                f"alone {a['compute_ms']:.2f} ms (fwd+bwd)", "",
                "| schedule | fwd ms | bwd ms | fwd+bwd ms | host ms | x vs `none` | x vs ref (`nodes`: diagnostic) "
                "| overlap efficiency | ref |",
                "|---|---|---|---|---|---|---|---|---|"]
        for r in p["rows"]:
            out.append(f"| {r['schedule']} | {f(r['fwd_ms'])} | {f(r['bwd_ms'])} | {f(r['total_ms'])} | "
                       f"{f(r.get('host_ms'))} | {f(r.get('speedup_vs_fastest_none'), 3)} | "
                       f"{f(r.get('speedup_vs_reference'), 3)} | {f(r.get('overlap_efficiency'))} | "
                       f"{r['reference'] or ''} |")
        m = p.get("megatron")
        if m:
            out += ["", f"Megatron-Core ({m['gpu']}, EP{m['world']}, alltoall, no overlap): {m['fwd_ms']} / "
                    f"{m['bwd_ms']} ms; ours (none, EP{doc['world']}): {m['ours_none_fwd_ms']:.2f} / "
                    f"{m['ours_none_bwd_ms']:.2f} ms" + ("" if m["comparable_world"] else " (different EP)")]
    return "\n".join(out)


def machine_info(device: str) -> dict:
    info = {"platform": platform.platform(), "processor": platform.processor(), "cpu_count": os.cpu_count(),
            "hostname": platform.node()}
    if device == "cuda":
        for key, cmd in (("nvidia_smi", ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version",
                                         "--format=csv,noheader"]), ("nvidia_smi_topo", ["nvidia-smi", "topo", "-m"])):
            try:
                info[key] = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
            except (OSError, subprocess.TimeoutExpired) as exc:
                info[key] = f"unavailable: {exc}"
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--world", type=int, default=None, help="EP size = ranks (default: all GPUs; 2 on CPU)")
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS),
                    help="repeatable (default: the three GPU shapes on cuda, tiny on cpu)")
    ap.add_argument("--chunks", default="2,4", help="comma-separated chunk counts of the chunked schedule")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 20 on cuda, 3 on cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="discarded rounds (default 3 on cuda, 1 on cpu)")
    ap.add_argument("--fabric", default="native", help="NCCL fabric of every rank: native | emulated-net "
                    "(moe_overlap/ep/fabric.py: NCCL's network transport over loopback)")
    ap.add_argument("--a2a", default="nccl", help="all-to-all transport: nccl | ce | auto (moe_overlap/ep/transport.py)")
    ap.add_argument("--sm-margin", default="", help="comma-separated SM margins: for each N > 0, the 1f1b rows "
                    "again with the expert GEMMs leaving N SMs to the all-to-all (moe_overlap/ep/sm_margin.py)")
    ap.add_argument("--ffn", type=int, default=None, help="expert ffn size for every preset (a 'balanced' preset then "
                    "skips its per-run choice: a fixed shape to compare runs, e.g. 14208 as in run 4)")
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="print the tables of a results JSON and exit")
    args = ap.parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    import torch

    from moe_overlap.verify.run.ranks import spawn_ranks

    if args.device == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here (use --device cpu --preset tiny for the smoke run)", file=sys.stderr)
        return 2
    world = args.world or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if args.device == "cuda" and world > torch.cuda.device_count():
        print(f"--world {world}: only {torch.cuda.device_count()} GPUs here", file=sys.stderr)
        return 2
    names = args.preset or (list(GPU_PRESETS) if args.device == "cuda" else ["tiny"])
    bad = [n for n in names if PRESETS[n]["experts"] % world]
    if bad:
        print(f"--world {world} does not divide the experts of {bad}", file=sys.stderr)
        return 2
    chunk_list = [int(c) for c in args.chunks.split(",") if c]
    try:
        margins = [int(m) for m in args.sm_margin.split(",") if m and int(m) > 0]
    except ValueError:
        print(f"--sm-margin {args.sm_margin!r}: must be comma-separated ints, e.g. 16,32", file=sys.stderr)
        return 2
    rounds = args.rounds or (20 if args.device == "cuda" else 3)
    warmup = args.warmup if args.warmup is not None else (3 if args.device == "cuda" else 1)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    from moe_overlap.ep.fabric import fabric_env

    try:
        fabric = fabric_env(args.fabric)
    except ValueError as err:
        print(f"--fabric: {err}", file=sys.stderr)
        return 2
    for k, v in {**NVLS_OFF, **fabric}.items():  # inherited by every spawned rank
        os.environ[k] = v
    backend = "nccl" if args.device == "cuda" else "gloo"
    # Spawned NCCL ranks unpickle bench_body by module name (benchmarks.gpu.ep_overlap_body), with this
    # process's sys.path; benchmarks/ is a regular package, so no installed `benchmarks` shadows it.
    from benchmarks.gpu.ep_overlap_body import bench_body

    per_rank = spawn_ranks(bench_body, world,
                           ([(n, dict(PRESETS[n], **({"ffn": args.ffn} if args.ffn else {}))) for n in names], args.device, dtype, rounds, warmup, chunk_list,
                            args.a2a, margins),
                           timeout=args.timeout, backend=backend, pass_group=True,
                           start_method="fork" if backend == "gloo" else "spawn")
    first = per_rank[0]
    presets = []
    for i, res in enumerate(first["results"]):
        p = {k: v for k, v in res.items() if k != "times"}
        p.update(derive(res, chunk_list, margins))
        p["median_ms"] = res["times"]
        p["megatron"] = megatron_comparison(res["preset"], world, p["rows"])
        agree = [r["results"][i]["agreement_rel_l2"] for r in per_rank]
        p["agreement_rel_l2"] = {k: max(a[k] for a in agree) for k in agree[0]}  # worst rank
        if "peak_memory_bytes" in res:
            p["peak_memory_bytes"] = max(r["results"][i]["peak_memory_bytes"] for r in per_rank)
        presets.append(p)
        print_preset(p, world)
    rel = Path(sys.argv[0]).resolve()
    doc = {
        "command": "python " + " ".join([str(rel.relative_to(ROOT)) if rel.is_relative_to(ROOT) else sys.argv[0]]
                                        + (sys.argv[1:] if argv is None else list(argv))),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {**machine_info(args.device), "gpu": first["gpu"], "rank_devices": [r["device"] for r in per_rank]},
        "versions": {"python": platform.python_version(), **first["versions"]},
        "world": world, "ep_size": world, "backend": backend, "fabric": args.fabric, "a2a": args.a2a,
        "dtype": dtype, "rounds": rounds, "warmup": warmup,
        "chunks": chunk_list, "sm_margins": margins, "routing": "force_balance (balanced top-k)",
        "rank_env": [r["env"] for r in per_rank],
        "timing": "CUDA events on the compute stream after an all-rank barrier (host clock on CPU); "
                  "medians over rounds of the max over ranks",
        "efficiency_definition": "(T_ref - T_overlap) / min(T_comm, T_compute), fwd+bwd",
        "speedup_definition": "speedup_vs_fastest_none = T_none / T_row (this run's `none`; benchmarks/gpu/ratios.py "
                              "takes the faster `none` of a same-call file with the other --a2a); speedup_vs_nodes "
                              "is a diagnostic (the 1F1B nodes in sequence), never a user's speedup",
        "presets": presets,
    }
    tag = "".join(f"_{v}" for v, d in ((args.fabric, "native"), (args.a2a, "nccl")) if v != d)
    out = args.out or ROOT / "benchmarks" / "results" / f"ep_overlap_{args.device}_r{world}{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
