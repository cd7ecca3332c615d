"""`moe-overlap estimate`: predict the benefit of EP overlap for a shape and fabric (wiring only)."""

from __future__ import annotations

import argparse

from moe_overlap.commands._common import EXIT_OK, CommandError, add_format_argument, emit

# CLI flag -> EstimateRequest field (only flags the user actually passed are forwarded).
_FIELDS = {
    "hidden": "hidden", "moe_ffn": "moe_ffn", "experts": "experts", "topk": "topk", "tokens": "tokens",
    "ep": "ep", "micro_batches": "micro_batches", "layers": "layers", "gpus_per_node": "gpus_per_node",
    "precision": "precision", "fabric": "fabric", "intra_gbps": "intra_gbps", "inter_gbps": "inter_gbps",
    "a2a_efficiency": "a2a_efficiency", "gpu_preset": "gpu_preset", "tflops": "tflops",
    "dense_tflops": "dense_tflops", "mem_gbps": "mem_gbps", "attn_ms": "attn_ms", "other_ms": "other_ms", "host_ms": "host_ms",
    "chunks": "chunks", "overlap_efficiency": "overlap_efficiency", "model": "model", "seq_length": "seq_length",
    "hbm_efficiency": "hbm_efficiency", "hbm_gbps": "hbm_gbps", "global_batch": "global_batch",
    "micro_batch_size": "micro_batch_size", "dp": "dp", "dispatcher": "dispatcher",
    "cuda_device_max_connections": "cuda_device_max_connections", "a2a_engine": "a2a_engine", "sm_margin": "sm_margin",
    "recompute": "recompute", "pp": "pp", "vpp": "vpp",
    "baseline_step_ms": "baseline_step_ms", "ep_stride": "ep_stride", "cuda_graph_scope": "cuda_graph_scope",
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    from moe_overlap.skill.estimate.hardware import GPUS, LINKS
    from moe_overlap.skill.estimate.models import MODELS

    g = p.add_argument_group("shape (per rank)")
    g.add_argument("--model", help="model preset (shapes from its public config, cited in the result): "
                   + ", ".join(sorted(MODELS)) + "; fills --hidden, --moe-ffn, --experts, --topk, --layers and the "
                   "attention time unless given")
    g.add_argument("--hidden", type=int, help="hidden size D (required without --model)")
    g.add_argument("--moe-ffn", type=int, help="expert FFN size F (required without --model)")
    g.add_argument("--experts", type=int, help="routed experts E (required without --model)")
    g.add_argument("--topk", type=int, help="experts per token K (required without --model)")
    g.add_argument("--tokens", type=int, help="tokens per rank per micro-batch (seq x mbs; default: the --model's "
                   "sequence length x --micro-batch-size)")
    g.add_argument("--seq-length", type=int, help="sequence length for a model preset's attention (default --tokens)")
    g.add_argument("--ep", type=int, help="expert-parallel degree (required)")
    g.add_argument("--micro-batches", type=int, help="micro-batches per step and DP rank (1f1b needs >= 2; "
                   "default: --global-batch / (--micro-batch-size x --dp), else 1)")
    g.add_argument("--global-batch", type=int, help="global batch size (sequences)")
    g.add_argument("--micro-batch-size", type=int, help="sequences per micro-batch (default 1)")
    g.add_argument("--dp", type=int, help="data-parallel size")
    g.add_argument("--pp", type=int, help="pipeline-parallel size (its bubble is never hidden; default 1)")
    g.add_argument("--vpp", type=int, help="virtual pipeline stages per rank (default 1)")
    g.add_argument("--recompute", choices=["none", "full"], help="full: per-layer full recompute (its forward "
                   "replay and its all-to-alls are not overlapped)")
    g.add_argument("--layers", type=int, help="MoE layers (default 1)")
    g.add_argument("--gpus-per-node", type=int, help="GPUs per node (NVLink domain) the EP group is packed into "
                   "(default: the --gpu-preset's, else 8)")
    g.add_argument("--ep-stride", type=int, help="GPUs between consecutive ranks of an EP group (TP x CP with "
                   "Megatron-Core's default rank order; default 1: the group packed into nodes)")
    g.add_argument("--precision", choices=["bf16", "fp16", "fp32"])
    h = p.add_argument_group("hardware")
    h.add_argument("--fabric", help="link presets joined by '+': " + ", ".join(sorted(LINKS))
                   + " (default: the --gpu-preset's usual system)")
    h.add_argument("--dispatcher", choices=["alltoall", "deepep", "hybridep"], help="token dispatcher: alltoall, "
                   "or flex with DeepEP / HybridEP (their published bandwidths)")
    h.add_argument("--cuda-device-max-connections", type=int, help="CUDA_DEVICE_MAX_CONNECTIONS of the job "
                   "(1 serialises the streams: the overlap hides about half as much)")
    h.add_argument("--cuda-graph-scope", nargs="+", choices=["full_iteration", "attn", "mlp", "moe", "moe_router",
                   "moe_preprocess", "mamba"], help="Megatron-Core's --cuda-graph-scope: graphed parts issue a "
                   "fraction of their host ops")
    h.add_argument("--sm-margin", type=int, help="SMs the expert GEMMs of a 1f1b layer pair leave to the all-to-all "
                   "kernels beside them (our layer's verify --sm-margin; default 0): the GEMMs' measured slowdown, and "
                   "no stall of an SM-driven all-to-all beside them")
    h.add_argument("--a2a-engine", choices=["sm", "copy-engine"], help="what moves the all-to-all bytes "
                   "(default sm: NCCL, DeepEP, HybridEP kernels)")
    h.add_argument("--intra-gbps", type=float, help="intra-node GB/s per GPU per direction")
    h.add_argument("--inter-gbps", type=float, help="inter-node GB/s per GPU per direction")
    h.add_argument("--link-gbps", type=float, help="one GB/s for both levels (sets --intra-gbps and --inter-gbps)")
    h.add_argument("--a2a-efficiency", type=float, help="achieved fraction of link bandwidth (default 0.75)")
    h.add_argument("--gpu-preset", help="GEMM throughput preset: " + ", ".join(sorted(GPUS)))
    h.add_argument("--tflops", type=float, help="expert GEMM TFLOP/s")
    h.add_argument("--dense-tflops", type=float, help="router/dense GEMM TFLOP/s (default: --tflops)")
    h.add_argument("--mem-gbps", type=float, help="memory-bound kernel GB/s")
    h.add_argument("--hbm-efficiency", type=float, help="achieved share of the GPU's HBM peak (--hbm-gbps or the "
                   "--gpu-preset's) by every memory-bound pass, bytes as the estimator counts them (0 < x <= 2)")
    h.add_argument("--mem-rate", metavar="FILE", help="the memory-bound passes' shares of HBM peak, one per kind, "
                   "measured at this shape by `python benchmarks/gpu/gpu_layer.py --sections experts layer` (its JSON; "
                   "e.g. benchmarks/results/h200x2_2026-11-29_r3/gpu_layer_after_router.json)")
    h.add_argument("--hbm-gbps", type=float, help="HBM peak GB/s of the GPU the shares apply to (default: the "
                   "--gpu-preset's datasheet value)")
    h.add_argument("--overlap-efficiency", type=float,
                   help="0..1, share of overlap achieved (default: the fabric preset's measured value, else the "
                        "calibration's, else 1)")
    h.add_argument("--calibrate", action="store_true",
                   help="measure this machine (GEMM, memory, all-to-all, overlap) with 2 spawned ranks and use it")
    h.add_argument("--from-run", metavar="DIR", help="use the rates a finished `moe-overlap verify` run measured "
                   "(its report.json: expert GEMM rate, all-to-all bandwidth and latency, overlap probe)")
    h.add_argument("--calibrate-backend", choices=["gloo", "nccl"], help="default: nccl on CUDA, else gloo")
    o = p.add_argument_group("model")
    o.add_argument("--attn-ms", type=float, help="attention/dense forward ms per layer and micro-batch")
    o.add_argument("--baseline-step-ms", type=float, help="your job's measured step time without overlap: what "
                   "the model leaves out of it is added to every schedule, never hidden")
    o.add_argument("--other-ms", type=float, help="ms per step outside the layers (optimizer, ...)")
    o.add_argument("--host-ms", type=float, help="host issue time of one layer's forward + backward per "
                   "micro-batch, no overlap (measured): no schedule is predicted faster than its host time")
    o.add_argument("--chunks", type=int, help="token chunks of the chunked schedule (default 4)")
    add_format_argument(p)


def run(args: argparse.Namespace) -> int:
    from moe_overlap.skill.estimate.api import EstimateError, estimate_overlap_benefit, parse_request
    from moe_overlap.skill.estimate.text import render_text

    data = {field: getattr(args, flag) for flag, field in _FIELDS.items() if getattr(args, flag) is not None}
    if args.link_gbps is not None:
        data.setdefault("intra_gbps", args.link_gbps)
        data.setdefault("inter_gbps", args.link_gbps)
    if args.calibrate and args.from_run is not None:
        raise CommandError("--calibrate and --from-run both give the machine's rates", field="from_run",
                           fix="keep one of them")
    if args.from_run is not None:
        from moe_overlap.verify.calibrate.run_calibration import RunCalibrationError, calibration_from_run

        try:
            data["calibration"] = calibration_from_run(args.from_run)[0].model_dump()
        except RunCalibrationError as exc:
            raise CommandError(str(exc), field="from_run",
                               fix="give the --out folder of a finished `moe-overlap verify` run") from None
    if args.calibrate_backend and not args.calibrate:
        raise CommandError("--calibrate-backend only applies to a calibration run", field="calibrate_backend",
                           fix="add --calibrate, or drop --calibrate-backend")
    if args.calibrate:
        from moe_overlap.verify.calibrate.machine import CalibrationFailed, CalibrationUnavailable, calibrate

        try:
            # Calibrate in the precision being estimated: CPU bf16 GEMMs run at another rate than fp32.
            data["calibration"] = calibrate(backend=args.calibrate_backend,
                                            precision=args.precision or "bf16").model_dump()
        except CalibrationUnavailable as exc:
            raise CommandError(f"--calibrate-backend: {exc}", field="calibrate_backend",
                               fix="use --calibrate-backend gloo, or leave it out (nccl is chosen when GPUs are there)") from None
        except CalibrationFailed as exc:
            raise CommandError(f"calibration failed: {exc}", exit_code=1,
                               fix="check that torch is installed and 2 processes can start") from None
    if args.mem_rate is not None and args.hbm_efficiency is not None:
        raise CommandError("--mem-rate and --hbm-efficiency both give the memory-bound shares", field="mem_rate",
                           fix="keep one of them")
    for key in ("a2a_efficiency", "hbm_efficiency"):  # 1e-320 passes `> 0` and overflows every time
        value = data.get(key)
        if isinstance(value, int | float) and 0 < value < MIN_SHARE:
            raise CommandError(f"--{key.replace('_', '-')} {value:g}: a share of the peak must be >= {MIN_SHARE:g}",
                               field=key, fix=f"give --{key.replace('_', '-')} as a realistic share, e.g. 0.7")
    try:
        if args.mem_rate is not None:
            data["hbm_efficiency"] = _mem_rate(args.mem_rate, parse_request(data))
        result = _estimate(estimate_overlap_benefit, parse_request(data))
    except EstimateError as exc:
        flag = "--" + exc.field.split(".")[0].replace("_", "-")
        fix = f"{exc.fix} ({flag})" if exc.fix else f"see the valid values of {flag}"
        raise CommandError(str(exc), field=exc.field, fix=fix,
                           choices=exc.choices) from None
    emit(result, args.format, render_text(result))
    return EXIT_OK


MIN_SHARE = 1e-6  # the smallest efficiency an estimate takes: times stay finite


def _estimate(estimate, request):
    """The estimate, or a usage error when the inputs give no finite time (skill/estimate/api.py _recommend's
    StopIteration on times that overflowed: rates or shares at the edge of the float range)."""
    try:
        return estimate(request)
    except (StopIteration, ArithmeticError):
        raise CommandError("these inputs give no finite step time (a rate or share so small or large that the "
                           "predicted times overflow)", fix="give rates and efficiencies in a realistic range "
                           "(e.g. --a2a-efficiency 0.7)") from None


def _mem_rate(path: str, req) -> dict:
    """The shares a gpu_layer.py file measured at the request's hidden and FFN sizes (model preset resolved)."""
    from moe_overlap.skill.estimate.memrate import MemRateError, load

    try:
        return load(path, hidden=req.hidden, moe_ffn=req.moe_ffn).efficiency.model_dump()
    except MemRateError as exc:
        raise CommandError(str(exc), field="mem_rate", fix=exc.fix) from None
