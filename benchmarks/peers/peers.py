"""Side by side with the peers: our MoE layer against torchtitan's (and Megatron-Core's), the same problem in
the same processes: same weights, same inputs, the same balanced top-k routing, bf16.

    python benchmarks/peers/peers.py --out $OUT/peers_r1.json                    # one H200: EP 1, both GPU shapes
    python benchmarks/peers/peers.py --world 2 --out $OUT/peers_r2.json          # two GPUs: EP 2 (NCCL)
    python benchmarks/peers/peers.py --device cpu --preset tiny --world 2        # gloo smoke run (seconds)
    python benchmarks/peers/peers.py --markdown benchmarks/results/peers_r1.json # re-print the table (docs)

Implementations (--impl, repeatable; ours first, it is the yardstick):
  ours            moe_overlap.ep.layer.MoELayer, schedule none (at EP > 1 also "ours chunked:2": the overlapped
                  schedule with a communication stream)
  torchtitan      torchtitan.models.common.moe.MoE from its own configs, EP through its own MoE.parallelize
                  (benchmarks/peers/peers_titan.py says what is mapped and how)
  megatron        Megatron-Core MoELayer without Transformer Engine: GroupedMLP when the grouped_gemm
                  extension imports, else SequentialMLP (benchmarks/peers/peers_megatron.py); CUDA only
Shapes (Qwen3-30B-A3B's MoE block from its Hugging Face config.json, and Megatron-Core's DeepSeek-V3 single-layer
proxy from Megatron-LM's MoE performance baseline), T tokens per
rank, all E experts split over the EP ranks: qwen3-30b-a3b T 4096, D 2048, F 768, E 128, top-8;
dsv3-proxy T 4096, D 7168, F 2048, E 32, top-8. Routing: softmax scores, the K chosen renormalised (Qwen3's
norm_topk_prob), expert (t*K + k) % E for token t's k-th slot in every implementation. What each rank runs and
how it is timed: benchmarks/peers/peers_body.py. Writes a JSON (--out) and prints a markdown table.
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
PRESETS = {
    "qwen3-30b-a3b": dict(tokens=4096, hidden=2048, ffn=768, experts=128, topk=8),
    "dsv3-proxy": dict(tokens=4096, hidden=7168, ffn=2048, experts=32, topk=8),
    "tiny": dict(tokens=64, hidden=32, ffn=16, experts=8, topk=2),  # CPU smoke shape: code paths, not speed
}
GPU_PRESETS = ("qwen3-30b-a3b", "dsv3-proxy")
IMPLS = ("ours", "torchtitan", "megatron")
TOLERANCE = 2e-2  # relative L2 between two bf16 implementations (each ~2^-8 per element from fp32)
NVLS_OFF = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def agreement_verdict(agreement: dict, tolerance: float = TOLERANCE) -> dict[str, dict]:
    """Per implementation: the worst relative L2 to ours (output, input grad, weight grads) and pass/fail."""
    out = {}
    for name, a in agreement.items():
        vs = a.get("vs_ours") or {}
        worst_key = max(vs, key=vs.get) if vs else None
        worst = vs[worst_key] if worst_key else None
        out[name] = {"worst_vs_ours": worst, "worst_key": worst_key,
                     "agrees": worst is not None and worst <= tolerance}
    return out


def _ms(row: dict | None, key: str) -> float | None:
    return row[key]["median_ms"] if row and key in row else None


def table_rows(doc: dict) -> list[dict]:
    """One row per (preset, implementation) of a results document, errors included."""
    rows = []
    for p in doc["presets"]:
        base = _ms(p["impls"].get("ours"), "fwd_bwd")
        verdict = agreement_verdict(p["agreement_rel_l2"], doc.get("tolerance", TOLERANCE))
        for name in list(p["impls"]) + list(p["errors"]):
            row = p["impls"].get(name)
            fb = _ms(row, "fwd_bwd")
            v = verdict.get(name, {})
            fp32 = (p["agreement_rel_l2"].get(name) or {}).get("vs_fp32") or {}
            rows.append({"preset": p["preset"], "ep": doc["world"], "impl": name,
                         "experts": (row or {}).get("describe", {}).get("experts"),
                         "fwd_ms": _ms(row, "fwd"), "fwd_bwd_ms": fb,
                         "vs_ours": fb / base if fb and base else None,
                         "worst_vs_ours": v.get("worst_vs_ours"), "worst_key": v.get("worst_key"),
                         "worst_vs_fp32": max(fp32.values()) if fp32 else None, "agrees": v.get("agrees"),
                         "error": p["errors"].get(name, "").split("\n")[0] or None})
    return rows


def markdown(doc: dict) -> str:
    """The results table of one JSON (docs/benchmarks.md), with its provenance line."""
    def f(v, fmt):
        return "-" if v is None else format(v, fmt)

    m = doc["machine"]
    lines = [f"EP {doc['world']}, {doc['dtype']}, {m.get('gpu') or 'CPU'}, {doc['date']}, torch "
             f"{doc['versions'].get('torch')}, torchtitan {doc['versions'].get('torchtitan')}: `{doc['command']}`", "",
             "| shape | EP | implementation | fwd ms | fwd+bwd ms | fwd+bwd / ours | max rel. L2 vs ours "
             "| max rel. L2 vs fp32 |", "|---|---|---|---|---|---|---|---|"]
    for r in table_rows(doc):
        name = r["impl"] + (f" ({r['experts']})" if r["impl"] == "megatron" and r["experts"] else "")
        if r["error"]:
            lines.append(f"| {r['preset']} | {r['ep']} | {name} | did not run: {r['error'][:120]} | | | | |")
            continue
        worst = "-" if r["worst_vs_ours"] is None else f"{r['worst_vs_ours']:.1e} ({r['worst_key']})"
        lines.append(f"| {r['preset']} | {r['ep']} | {name} | {f(r['fwd_ms'], '.3f')} | {f(r['fwd_bwd_ms'], '.3f')} "
                     f"| {f(r['vs_ours'], '.2f')} | {worst} | {f(r['worst_vs_fp32'], '.1e')} |")
    notes = [n for n in doc.get("notes", [])]
    if notes:
        lines += [""] + [f"- {n}" for n in notes]
    return "\n".join(lines)


def grouped_gemm_log(path: Path | None) -> dict | None:
    """The tail of the grouped_gemm build log the GPU command wrote (why Megatron's grouped path is missing)."""
    if path is None:
        return None
    if not path.is_file():
        return {"path": str(path), "missing": True}
    text = path.read_text(errors="replace").strip().splitlines()
    return {"path": str(path), "tail": text[-25:]}


def check_run(device: str, world: int, names: list[str], gpus: int) -> str | None:
    """Why this run cannot start (naming the option to change), or None."""
    if device == "cuda" and gpus == 0:
        return "--device cuda: no CUDA device here (use --device cpu --preset tiny for the smoke run)"
    if world < 1 or (device == "cuda" and world > gpus):
        return f"--world {world}: must be 1 .. {gpus if device == 'cuda' else 'any'} (ranks, one GPU each on cuda)"
    bad = [n for n in names if PRESETS[n]["experts"] % world]
    if bad:
        return f"--world {world} does not divide the experts of {bad}: pick a world that divides them"
    return None


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    ap.add_argument("--world", type=int, default=1, help="EP size = ranks (one GPU each on cuda)")
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS),
                    help="repeatable (default: the two GPU shapes on cuda, tiny on cpu)")
    ap.add_argument("--impl", action="append", choices=IMPLS, help="repeatable (default: all; megatron on cuda only)")
    ap.add_argument("--ours-chunks", type=int, default=2, help="chunks of our overlapped schedule at EP > 1 (0: off)")
    ap.add_argument("--titan-backend", choices=("spmd_types", "partial_dtensor"), default="spmd_types",
                    help="torchtitan's SPMD backend (its default: spmd_types)")
    ap.add_argument("--megatron", choices=("auto", "grouped", "sequential"), default="auto",
                    help="auto: GroupedMLP when grouped_gemm imports, else SequentialMLP")
    ap.add_argument("--grouped-gemm-log", type=Path, default=None, help="build log of grouped_gemm to record")
    ap.add_argument("--rounds", type=int, default=None, help="timed rounds (default 20 on cuda, 3 on cpu)")
    ap.add_argument("--warmup", type=int, default=None, help="discarded rounds (default 3 on cuda, 1 on cpu)")
    ap.add_argument("--no-fp32-reference", action="store_true", help="skip our layer in fp32 (agreement only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=540)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--markdown", type=Path, default=None, help="print the table of a results JSON and exit")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    import torch

    from moe_overlap.verify.run.ranks import RankError, spawn_ranks

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = args.preset or (list(GPU_PRESETS) if args.device == "cuda" else ["tiny"])
    problem = check_run(args.device, args.world, names, gpus)
    if problem:
        print(problem, file=sys.stderr)
        return 2
    impls = [i for i in IMPLS if i in (args.impl or IMPLS)]
    notes = []
    if args.device == "cpu" and "megatron" in impls:
        impls.remove("megatron")
        notes.append("megatron skipped on CPU: its alltoall dispatcher and router need CUDA")
    if "ours" in impls and args.world > 1 and args.ours_chunks > 1:
        impls.insert(1, f"ours chunked:{args.ours_chunks}")
    rounds = args.rounds or (20 if args.device == "cuda" else 3)
    warmup = args.warmup if args.warmup is not None else (3 if args.device == "cuda" else 1)
    for k, v in NVLS_OFF.items():  # the device machines' rule, inherited by every rank
        os.environ.setdefault(k, v)
    # Spawned ranks unpickle peers_body by module name (benchmarks.peers.peers_body), with this sys.path.
    from benchmarks.peers.peers_body import peers_body

    opts = {"impls": impls, "titan_backend": args.titan_backend, "megatron": args.megatron, "rounds": rounds,
            "warmup": warmup, "seed": args.seed, "fp32_reference": not args.no_fp32_reference}
    try:
        per_rank = spawn_ranks(peers_body, args.world, ([(n, PRESETS[n]) for n in names], args.device, opts),
                               backend="nccl" if args.device == "cuda" else "gloo", timeout=args.timeout,
                               pass_group=True)
    except RankError as exc:
        print(f"ranks failed:\n{exc}", file=sys.stderr)
        return 1
    first = per_rank[0]
    for i, p in enumerate(first["results"]):
        for name, row in p["impls"].items():  # every rank's notes (the same in practice), once
            row["notes"] = sorted({n for r in per_rank for n in r["results"][i]["impls"][name]["notes"]})
    doc = {"command": "python benchmarks/peers/peers.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": {"gpu": first["gpu"], "platform": platform.platform(), "cpu_count": os.cpu_count(),
                       "rank_devices": [r["device"] for r in per_rank]},
           "versions": {"python": platform.python_version(), **first["versions"]},
           "world": args.world, "ep_size": args.world, "dtype": "bfloat16", "rounds": rounds, "warmup": warmup,
           "tolerance": TOLERANCE, "impls": impls,
           "timing": "CUDA events after an all-rank barrier (host clock on CPU); per round the slowest rank; "
                     "median over rounds; forward = training forward (autograd on)",
           "grouped_gemm_build": grouped_gemm_log(args.grouped_gemm_log),
           "notes": notes + run_notes(first, impls), "presets": first["results"]}
    out = args.out or ROOT / "benchmarks" / "results" / f"peers_{args.device}_r{args.world}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(markdown(doc))
    print(f"\nwrote {out}")
    failed = [r for r in table_rows(doc) if r["agrees"] is False]
    for r in failed:
        print(f"DISAGREES: {r['preset']} {r['impl']}: {r['worst_key']} {r['worst_vs_ours']:.2e} > {TOLERANCE}",
              file=sys.stderr)
    return 3 if failed else 0


def run_notes(first: dict, impls: list[str]) -> list[str]:
    """What the run needed or did differently per implementation (goes under the table)."""
    notes = ["same weights, inputs and balanced routing in every implementation; bf16 parameters and activations"]
    if "torchtitan" in impls:
        notes.append("torchtitan installed from its wheel with --no-deps (+ spmd_types, tyro, docstring_parser, "
                     "typeguard; triton to import); routing by its own _debug_force_load_balance; its router still "
                     "runs its top-k before the balanced override replaces it (ours skips it)")
    for p in first["results"]:
        for name, row in p["impls"].items():
            notes += [f"{p['preset']} {name}: {n}" for n in row["notes"]]
    return list(dict.fromkeys(notes))


if __name__ == "__main__":
    raise SystemExit(main())
