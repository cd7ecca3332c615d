#!/usr/bin/env python3
"""The estimator against measured numbers: the two public anchors and our own multi-GPU layer runs.

    python benchmarks/estimator/estimate_anchors.py              # the table (markdown), as in docs/estimate.md
    python benchmarks/estimator/estimate_anchors.py --json out.json

Torch-free, no GPU: it runs the estimator (moe_overlap/skill/estimate) on the anchors' inputs and compares.

* Qwen3-30B-A3B, 16xH100, EP16 (Megatron-Bridge skill skills/mbridge-perf-expert-parallel-overlap/SKILL.md):
  step 41.25 s without overlap, 31.31 s with it (1.317x), 31.20 s with delayed wgrad. Presets only, then
  calibrated on the measured no-overlap step: what the model leaves out (data-parallel gradient reduction,
  optimizer, embedding and loss, routing imbalance) is the difference, added to every schedule unhidden.
* DeepSeek-V3 proxy MoE layer, 8xH100, EP8, alltoall, no overlap (Megatron-LM moe_perf baseline):
  7.12 ms forward + 10.48 ms backward. Presets, then calibrated: the expert GEMM rate measured on an H200 at the
  anchor's per-rank shape (4 local experts x 8192 rows, benchmarks/gpu/gemm_rate.py; the file GEMM_RATE_FILE names,
  or --gemm-rate FILE: named, so a new measurement never changes the table silently; H100 SXM and H200 have the
  same tensor-core peak, they differ in HBM); the memory-bound passes (gathers, sorts, SwiGLU, weight-gradient
  accumulation) at the shares of HBM peak each kind achieved on an H200 at the same per-rank rows
  (moe_overlap/skill/estimate/memrate.py reads the gpu_layer.py file MEM_RATE_FILE names, or --mem-rate FILE),
  applied to H100 SXM's 3.35 TB/s; the all-to-alls from the presets. Both anchors' calibrated columns use the
  memory shares (each at its own shape).
* Our layer at EP >= 2 (benchmarks/gpu/ep_overlap.py via benchmarks/run_multi_gpu.sh; results files
  ep_overlap_cuda_r<N>*.json anywhere under benchmarks/results/): calibrated on the same run's pieces (expert GEMMs alone,
  all-to-alls alone, the rest of the no-overlap layer as fixed cost) and its host time (the host floor,
  moe_overlap/skill/estimate/host.py), overlap efficiency from the link preset; predicted 1f1b vs measured.
  Host time per layer: the no-overlap row's ``host_ms`` where the run records it, else, for the native-NCCL run
  the profile of the same session measured (HOST_PROFILE), that profile's host time of the no-overlap layer scaled
  by the profiler's host inflation (the host-bound shape's unprofiled / profiled wall time), else none (no floor).
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from moe_overlap.skill.estimate import memrate  # noqa: E402
from moe_overlap.skill.estimate.api import estimate_overlap_benefit, parse_request  # noqa: E402

QWEN3 = dict(model="qwen3-30b-a3b", tokens=4096, ep=16, micro_batches=64, fabric="h100-nvlink+ib-400g",
             gpu_preset="h100")
QWEN3_MEASURED = {"none": 41.25, "1f1b": 31.31, "1f1b+wgrad": 31.20}  # seconds per step
PROXY = dict(model="deepseek-v3-proxy", tokens=4096, ep=8, fabric="h100-nvlink", gpu_preset="h100")
PROXY_MEASURED_MS = 7.12 + 10.48
QWEN3_SHAPE = {"hidden": 2048, "moe_ffn": 768}  # the model presets' (moe_overlap/skill/estimate/models.py)
PROXY_SHAPE = {"hidden": 7168, "moe_ffn": 2048}
LAYER_SHAPES = {"qwen3-30b-a3b": dict(hidden=2048, moe_ffn=768, experts=128, topk=8),
                "deepseek-v3": dict(hidden=7168, moe_ffn=2048, experts=256, topk=8),
                "dsv3-proxy": dict(hidden=7168, moe_ffn=2048, experts=32, topk=8)}
# The profile of the two-H200 session of 2026-11-29 (before rows carried host_ms): host time of its NCCL run.
HOST_PROFILE = "benchmarks/results/h200x2_2026-11-29/profile_cuda_r2.json"
GEMM_SHAPE = "dsv3-proxy-ep8"  # benchmarks/gpu/gemm_rate.py's name of the anchor's per-rank expert shape
GEMM_RATE_FILE = "benchmarks/results/h200_2026-11-29_gemm/gemm_rate.json"  # one H200, 2026-11-29
# Our layer at EP 1 on one H200, profiled kernel by kernel (python benchmarks/gpu/gpu_layer.py --sections experts layer):
# the memory-bound passes' achieved shares of HBM peak, at the anchors' per-rank rows (4096 tokens x top-8).
MEM_RATE_FILE = "benchmarks/results/h200x2_2026-11-29_r3/gpu_layer_after_router.json"
PAIRS = 64  # micro-batches in the 1f1b estimate of one layer: edge effects (first forward, last backward) 1/64


def _est(**req):
    return {s.name: s for s in estimate_overlap_benefit(parse_request(req)).schedules}


def _row(what, quantity, predicted, measured, calibrated=None, source=""):
    err = predicted / measured - 1
    cal_err = calibrated / measured - 1 if calibrated is not None else None
    return {"what": what, "quantity": quantity, "predicted": predicted, "predicted_calibrated": calibrated,
            "measured": measured, "error": err, "error_calibrated": cal_err, "source": source}


def anchor_rows(gemm_rate_file: str | None = GEMM_RATE_FILE, mem_rate_file: str | None = MEM_RATE_FILE
                ) -> list[dict]:
    rows = []
    s = _est(**QWEN3)
    qmem = mem_shares(mem_rate_file, QWEN3_SHAPE) if mem_rate_file else None
    mem = {"hbm_efficiency": qmem.efficiency} if qmem else {}
    # Calibrated: the memory shares measured at this shape, and the measured no-overlap step: what the model
    # leaves out is the difference, never overlapped.
    other = QWEN3_MEASURED["none"] * 1e3 - _est(**QWEN3, **mem)["none"].step_ms
    c = _est(**QWEN3, **mem, other_ms=max(0.0, other))
    src = "Megatron-Bridge skills/mbridge-perf-expert-parallel-overlap/SKILL.md" + (
        f"; memory-bound shares of HBM peak: {qmem.efficiency.source}" if qmem else "")
    what = "Qwen3-30B-A3B, 16xH100 EP16"
    for name in ("none", "1f1b", "1f1b+wgrad"):
        rows.append(_row(what, f"step s, {name}", s[name].step_ms / 1e3, QWEN3_MEASURED[name],
                         c[name].step_ms / 1e3, src))
    rows.append(_row(what, "speedup 1f1b", s["1f1b"].speedup, QWEN3_MEASURED["none"] / QWEN3_MEASURED["1f1b"],
                     c["1f1b"].speedup, src))
    rows[-1]["other_s"] = max(0.0, other) / 1e3
    p = _est(**PROXY)
    rate, rate_file = gemm_rate(gemm_rate_file) if gemm_rate_file else (None, None)
    pmem = mem_shares(mem_rate_file, PROXY_SHAPE) if mem_rate_file else None
    cal = dict({"tflops": rate} if rate else {}, **({"hbm_efficiency": pmem.efficiency} if pmem else {}))
    cal_ms = _est(**PROXY, **cal)["none"].step_ms if cal else None
    row = _row("DeepSeek-V3 proxy layer, 8xH100 EP8", "fwd+bwd ms, no overlap", p["none"].step_ms,
               PROXY_MEASURED_MS, cal_ms, "Megatron-LM moe_perf baseline"
               + (f"; GEMM rate {rate:g} TFLOP/s at its per-rank shape on an H200: {rate_file}" if rate else "")
               + (f"; memory-bound shares of HBM peak: {pmem.efficiency.source}" if pmem else ""))
    if cal:
        row["terms_calibrated_ms"] = terms(_result(**PROXY, **cal))
    row["terms_presets_ms"] = terms(_result(**PROXY))
    rows.append(row)
    return rows


def _result(**req):
    return estimate_overlap_benefit(parse_request(req))


def terms(r) -> dict[str, float]:
    """The no-overlap layer's terms, ms (forward + backward, one micro-batch)."""
    p = r.per_layer
    return {"expert GEMMs": 3 * p.expert_fwd_ms, "all-to-alls": 4 * p.a2a_ms + 5 * p.a2a_latency_ms,
            "permute/unpermute": p.permute_ms, "sort/unsort": p.sort_ms, "SwiGLU": p.activation_ms,
            "wgrad accumulation": p.wgrad_write_ms, "router": 3 * p.router_fwd_ms,
            "attention + overhead": 3 * p.attn_fwd_ms + p.overhead_ms}


class InputError(ValueError):
    """A named input file cannot be used (says which and why)."""


def gemm_rate(path: str) -> tuple[float, str]:
    """(TFLOP/s, file as labelled) of the anchor's per-rank expert shape in a benchmarks/gpu/gemm_rate.py JSON."""
    full = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        data = json.loads(full.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"--gemm-rate {path}: not a readable JSON file ({exc})") from None
    shape = data.get("shapes", {}).get(GEMM_SHAPE) if isinstance(data, dict) else None
    if not shape or data.get("device") != "cuda":
        raise InputError(f"--gemm-rate {path}: no GPU measurement of shape {GEMM_SHAPE!r}; give the --out file of "
                         "`python benchmarks/gpu/gemm_rate.py --device cuda`")
    return float(shape["tflops"]), _label(str(full))


def mem_shares(path: str, shape: dict) -> memrate.MemRate:
    """The memory-bound shares of HBM peak measured at ``shape``'s hidden and FFN sizes in a gpu_layer.py file."""
    full = Path(path) if Path(path).is_absolute() else ROOT / path
    try:
        return memrate.load(full, hidden=shape["hidden"], moe_ffn=shape["moe_ffn"], label=_label(str(full)))
    except memrate.MemRateError as exc:
        raise InputError(f"--mem-rate {exc}") from None


def _label(path: str) -> str:
    """The file as the table names it: relative to the repository when inside it."""
    full = Path(path).resolve()
    return str(full.relative_to(ROOT)) if full.is_relative_to(ROOT) else str(full)


def _run_tag(label: str, *known: str) -> str:
    """Which run a row comes from: its results folder, and what the file name adds (``repeat``) beyond the
    fabric and transport the row already names."""
    path = Path(label)
    extra = re.fullmatch(r".*_r\d+(?:_(.+))?", path.stem)
    extra = " ".join(t for t in (extra.group(1) or "").split("_") if t not in known) if extra else ""
    return path.parent.name + (f" {extra}" if extra else "")


def profile_host_ms(result_file: str, data: dict) -> tuple[dict[str, float], str]:
    """Per preset, host ms of the no-overlap layer from the profile of the same session (HOST_PROFILE), for the
    run that profile measured (same folder, world, fabric, transport); ({}, "") for any other run."""
    prof_path = ROOT / HOST_PROFILE
    if not prof_path.exists() or Path(result_file).resolve().parent != prof_path.parent:
        return {}, ""
    prof = json.loads(prof_path.read_text(encoding="utf-8"))
    if (prof.get("world"), prof.get("fabric") or "native", prof.get("a2a") or "nccl") != (
            data.get("world"), data.get("fabric") or "native", data.get("a2a") or "nccl"):
        return {}, ""
    none = {p["preset"]: {r["schedule"]: r["total_ms"] for r in p["rows"]}.get("none") for p in data["presets"]}
    host, wall = {}, {}
    for rank in prof["ranks"]:  # the slowest rank
        for p in rank["presets"]:
            s = p["summary"]["none"]
            host[p["preset"]] = max(host.get(p["preset"], 0.0), s["host_ms"])
            wall[p["preset"]] = max(wall.get(p["preset"], 0.0), s["wall_ms"])
    both = [k for k in host if none.get(k)]
    if not both:
        return {}, ""
    # torch.profiler adds host time to every op; in a host-bound layer the wall time is the host's, so its
    # unprofiled / profiled wall time is the inflation (a GPU-bound layer's ratio is nearer 1: min takes the former).
    scale = min(none[k] / wall[k] for k in both)
    return ({k: host[k] * scale for k in both},
            f"{HOST_PROFILE}: profiled host ms of the no-overlap layer x {scale:.3f} (profiler inflation)")


def _ours(files: list[str]) -> list[tuple[str, int, str, str, dict[str, tuple]]]:
    """(label, world, fabric, transport, {preset: (none, 1f1b, a2a alone, experts alone, host ms, host source)})
    per results file."""
    out = []
    for path in files:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        if int(data.get("world", 1)) < 2:
            continue
        found = {}
        fallback, fallback_src = profile_host_ms(path, data)
        for p in data.get("presets", []):
            rows = {r["schedule"]: r for r in p.get("rows", [])}
            if p.get("preset") in LAYER_SHAPES and "none" in rows and "1f1b" in rows:
                alone = p.get("alone", {})
                host = rows["none"].get("host_ms")
                src = "the run's no-overlap row (host_ms)" if host else fallback_src
                host = host or fallback.get(p["preset"])
                found[p["preset"]] = (rows["none"]["total_ms"], rows["1f1b"]["total_ms"], alone.get("comm_ms"),
                                      alone.get("compute_ms"), host, src if host else "")
        if found:
            out.append((_label(path), int(data["world"]), data.get("fabric") or "native",
                        data.get("a2a") or "nccl", found))
    return out


def our_rows(files: list[str]) -> list[dict]:
    rows = []
    for label, world, fabric, transport, found in _ours(files):
        link = "h200-nvlink" if fabric == "native" else "h200-nvlink+ib-400g"
        for preset, (none, pair, a2a, experts, host, host_src) in found.items():
            # our layer: no Megatron-Core op-count host estimate (its own host time is the floor when recorded)
            shape = dict(LAYER_SHAPES[preset], tokens=4096, ep=world, gpus_per_node=8 if fabric == "native" else 1,
                         megatron_host=False)
            if fabric != "native" and world > 1:
                shape["gpus_per_node"] = 1  # emulated network: every peer is "another node"
            plain = _est(**shape, fabric=link, gpu_preset="h200", micro_batches=PAIRS)
            what = f"ours, {preset}, EP {world}, {fabric}, {transport}, {_run_tag(label, fabric, transport)}"
            rows.append(_row(what, "layer fwd+bwd ms, none (presets)", plain["none"].step_ms / PAIRS, none,
                             None, label))
            # Calibrated on the same run: expert rate from the experts alone, bandwidth from the all-to-alls
            # alone, the rest of the no-overlap layer as a fixed per-layer cost; efficiency from the link preset.
            flops = 18.0 * shape["hidden"] * shape["moe_ffn"] * 4096 * shape["topk"]
            sent = 4096 * shape["topk"] * shape["hidden"] * 2 * (world - 1) / world
            cal = dict(shape, micro_batches=PAIRS, tflops=flops / (experts * 1e-3) / 1e12, mem_gbps=None,
                       intra_gbps=sent / (a2a / 4 * 1e-3) / 1e9, inter_gbps=sent / (a2a / 4 * 1e-3) / 1e9,
                       a2a_efficiency=1.0, overhead_ms=max(0.0, none - experts - a2a), host_ms=host)
            cal = {k: v for k, v in cal.items() if v is not None}
            full = estimate_overlap_benefit(parse_request(dict(cal, fabric=link)))
            eff = {s.name: s for s in full.schedules}
            row = _row(what, "speedup 1f1b (calibrated on the run's pieces)", plain["1f1b"].speedup,
                       none / pair, eff["1f1b"].speedup, label)
            row.update(host_ms=host, host_source=host_src, host_bound=any(x.startswith("host-bound") for x in full.reasons))
            rows.append(row)
    return rows


def _fmt(x, q):
    if x is None:
        return "-"
    return f"{x:.3f}x" if "speedup" in q else f"{x:.2f}"


def markdown(rows: list[dict]) -> str:
    lines = ["| what | quantity | predicted (presets) | predicted (calibrated) | measured | error | error, "
             "calibrated |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        cal = "-" if r["error_calibrated"] is None else f"{r['error_calibrated']:+.0%}"
        lines.append(f"| {r['what']} | {r['quantity']} | {_fmt(r['predicted'], r['quantity'])} | "
                     f"{_fmt(r['predicted_calibrated'], r['quantity'])} | {_fmt(r['measured'], r['quantity'])} | "
                     f"{r['error']:+.0%} | {cal} |")
    sources = sorted({r["source"] for r in rows})
    hosts = [f"- host floor of {r['what']}: {r['host_ms']:.2f} ms per layer"
             + (" (host-bound: overlap cannot help)" if r["host_bound"] else "") + f"; {r['host_source']}"
             for r in rows if r.get("host_ms")]
    split = [f"- {r['what']}, {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in r[key].items() if v)
             + f" (sum {sum(r[key].values()):.2f})" for r in rows
             for key, label in (("terms_presets_ms", "terms from presets, ms"),
                                ("terms_calibrated_ms", "terms calibrated, ms")) if r.get(key)]
    other = [f"- {r['what']}, calibrated: {r['other_s']:.2f} s per step outside the modelled layers (the measured "
             "no-overlap step minus its prediction), added to every schedule, never overlapped"
             for r in rows if r.get("other_s") is not None]
    return "\n".join(lines + [""] + [f"- {s}" for s in sources] + hosts + other + split)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", help="also write the rows as JSON here")
    ap.add_argument("--results", nargs="*", default=None,
                    help="ep_overlap result files at EP >= 2 (default: every ep_overlap_cuda_r*.json under "
                         "benchmarks/results/)")
    ap.add_argument("--gemm-rate", default=GEMM_RATE_FILE, help="benchmarks/gpu/gemm_rate.py JSON that calibrates the "
                    f"proxy anchor's GEMM term (default {GEMM_RATE_FILE}); '' for presets only")
    ap.add_argument("--mem-rate", default=MEM_RATE_FILE, help="benchmarks/gpu/gpu_layer.py JSON whose profiled EP-1 "
                    "layer gives the memory-bound passes' shares of HBM peak for both anchors' calibrated columns "
                    f"(default {MEM_RATE_FILE}); '' for the presets' memory rate")
    args = ap.parse_args()
    files = args.results if args.results is not None else sorted(
        glob.glob(str(ROOT / "benchmarks" / "results" / "**" / "ep_overlap_cuda_r*.json"), recursive=True))
    try:
        rows = anchor_rows(args.gemm_rate, args.mem_rate) + our_rows(files)
    except InputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"command": "python benchmarks/estimator/estimate_anchors.py", "rows": rows},
                                              indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
