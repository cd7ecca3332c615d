"""A finished verification run as the estimator's calibration (torch-free).

The run's pieces (verify/calibrate/pieces.py: the step's all-to-alls, count exchanges and expert GEMMs timed alone, and
the overlap probe) are rates of this machine and this transport, measured in the ranks that trained:

  expert_tflops       expert GEMM FLOPs of one step / their time alone
  a2a_latency_us      one count exchange (a few bytes per rank): the fixed cost of one collective
  a2a_gbps            bytes one rank sends off-rank per all-to-all / (its time alone - that latency)
  overlap_efficiency  the probe's hidden share (one dispatch beside one expert forward), clipped to [0, 1]
  host_ms             the layers' host issue time per layer and micro-batch (timed alone, no overlap): the
                      estimator's host floor; CUDA runs only (host_floor_input says why), absent in older runs

`moe-overlap estimate --from-run DIR` feeds them to the estimator for any shape; the report's own prediction
(verify/judge/explain.py) uses them for the run's shape.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from moe_overlap.skill.estimate.model import Calibration
from moe_overlap.verify.judge.analysis_model import StepPieces
from moe_overlap.verify.rundir.read import RunFolderError, read_json

MAX_RANKS = 4096


class RunCalibrationError(ValueError):
    """The run folder or report cannot feed the estimator (names what is missing and the fix)."""


def balanced_work(shape: dict[str, Any], world: int, micro_batches: int, layers: int) -> tuple[float, float]:
    """(expert FLOPs per step, off-rank bytes per all-to-all) of a shape under balanced routing: the
    estimator's own counting (skill/estimate/api.py)."""
    routed = shape["tokens"] * shape["topk"]
    flops = 18.0 * shape["hidden"] * shape["moe_ffn"] * routed * micro_batches * layers
    return flops, routed * shape["hidden"] * shape["bytes"] * (world - 1) / world


def calibration_from_pieces(pieces: StepPieces, *, backend: str, world: int, precision: str, source: str,
                            shape: dict[str, Any] | None = None) -> tuple[Calibration | None, str]:
    """(calibration, note); None with the reason when the pieces cannot give the rates (EP 1, nothing timed).

    Without ``shape``: the machine's rates (the busiest rank's FLOPs and bytes over their times), for any shape.
    With the run's ``shape`` (hidden, moe_ffn, tokens, topk, bytes): effective rates, the run's pieces divided
    into the work the estimator counts for that shape (balanced routing), so that the estimate of this very run
    reproduces its measured pieces, routing imbalance included.
    """
    if world < 2 or pieces.a2a_calls == 0 or pieces.a2a_bytes_off_rank == 0:
        return None, "EP 1: no all-to-all was measured (nothing to overlap)"
    if pieces.experts_s <= 0 or pieces.expert_flops <= 0:
        return None, "the expert GEMMs were not timed"
    per_call = pieces.a2a_s / pieces.a2a_calls
    if per_call <= 0:
        return None, "the all-to-alls took no measurable time"
    latency = pieces.count_exchange_s / pieces.count_exchanges if pieces.count_exchanges else 0.0
    # The count exchange also copies counts to the host: never let it claim more than half an all-to-all.
    latency = min(latency, 0.5 * per_call)
    flops, per_call_bytes = pieces.expert_flops, pieces.a2a_bytes_off_rank / pieces.a2a_calls
    kind = "rates"
    if shape is not None:
        flops, per_call_bytes = balanced_work(shape, world, pieces.micro_batches, pieces.layers)
        kind = "effective rates for the run's shape (its routing imbalance included)"
    gbps = per_call_bytes / (per_call - latency) / 1e9
    eff = pieces.probe.overlap_efficiency
    tflops = flops / pieces.experts_s / 1e12
    try:
        cal = Calibration(
            expert_tflops=tflops, dense_tflops=tflops, a2a_gbps=gbps, a2a_latency_us=latency * 1e6,
            overlap_efficiency=min(1.0, max(0.0, eff)) if eff is not None else 0.0, overhead_ms=0.0,
            source=f"{source}: {backend}, {world} ranks, {precision}; {kind} from the pieces timed alone after "
                   f"training (median of {pieces.rounds} rounds, slowest rank); router GEMMs at the expert rate",
        )
    except ValidationError as exc:  # times of 1e-320 s or 1e300 bytes (a damaged record): rates out of range
        err = exc.errors()[0]
        return None, f"the pieces give a rate out of range ({'.'.join(map(str, err['loc']))}: {err['msg']})"
    note = ("overlap efficiency from the run's overlap probe" if eff is not None
            else "no overlap probe: efficiency 0")
    if eff is not None and not 0.0 <= eff <= 1.0:
        note += f" (measured {eff:.2f}, clipped to [0, 1])"
    return cal, note


def host_floor_input(pieces: StepPieces | None, device: str) -> tuple[float | None, str]:
    """(host ms per layer and micro-batch for the estimator's floor, or None; why)."""
    if pieces is None or not pieces.host_ms_per_layer:
        return None, "no host floor: the layers' host issue time was not recorded (a run before it was)"
    if device != "cuda":
        # On CPU every op runs as the host issues it: the host time *is* the compute time, never a limit
        # apart from it, so a floor would call every CPU run host-bound. What limits CPU overlap is gloo's
        # thread sharing the cores with the compute (the overlap probe measures that).
        return None, (f"no host floor on CPU: ops run as they are issued, so the host time "
                      f"({pieces.host_ms_per_layer:.3f} ms per layer and micro-batch) is the compute time itself")
    return pieces.host_ms_per_layer, (f"host floor: {pieces.host_ms_per_layer:.3f} ms per layer and micro-batch "
                                      "to issue (the layers timed alone after training)")


class _Env(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    backend: str = Field("?", max_length=100)
    nproc: int = Field(1, ge=1, le=MAX_RANKS)
    device: str | None = Field(None, max_length=100)


class _Analysis(BaseModel):
    model_config = ConfigDict(extra="ignore")

    pieces: dict[str, Any] | None = None


class _Report(BaseModel):
    """The parts of report.json the calibration reads, validated (a hand-made or damaged report is refused
    naming the field: a list where a number stands, a NaN or Infinity among the pieces)."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    format: Literal["moe-overlap-verification-report"]
    environment: _Env = Field(default_factory=_Env)
    config: dict[str, Any] = Field(default_factory=dict)
    analysis: _Analysis | None = None
    out_dir: str | None = Field(None, max_length=4096)
    started_at: str | None = Field(None, max_length=100)


def _finite_pieces(pieces: dict[str, Any], where: str) -> StepPieces:
    bad = [k for k, v in _numbers(pieces) if not math.isfinite(v)]
    if bad:
        raise RunCalibrationError(f"{where}: analysis.pieces.{bad[0]} is not a finite number (NaN or Infinity): "
                                  "a run writes finite times; the report was damaged or edited")
    try:
        return StepPieces.model_validate(pieces)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise RunCalibrationError(f"{where}: analysis.pieces.{field}: {err['msg']}") from None


def _numbers(data: Any, prefix: str = ""):
    if isinstance(data, float):
        yield prefix, data
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from _numbers(v, f"{prefix}.{k}" if prefix else str(k))


def load_run(path: str | Path) -> dict[str, Any]:
    """report.json of a verification run (a folder or the file itself), read by the run folder's reader
    (verify/rundir: a plain file, no link followed, bounded, strict JSON) and validated."""
    if str(path) == "":
        raise RunCalibrationError("--from-run '': an empty folder name; give the --out folder of a finished run")
    path = Path(path)
    try:
        is_dir = path.is_dir()
    except OSError:
        is_dir = False
    folder, name = (path, "report.json") if is_dir else (path.parent, path.name)
    where = folder / name
    try:
        data = read_json(folder, name, what="verification report", allow_nan=True)
    except RunFolderError as exc:
        raise RunCalibrationError(f"not a readable verification report: {exc.message}") from None
    if not isinstance(data, dict) or data.get("format") != "moe-overlap-verification-report":
        raise RunCalibrationError(f"{where}: not a moe-overlap verification report")
    try:
        _Report.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise RunCalibrationError(f"{where}: {field}: {err['msg']}") from None
    return data


def calibration_from_run(path: str | Path) -> tuple[Calibration, dict[str, Any]]:
    """The calibration a finished run gives, and the run's config (to compare shapes)."""
    data = load_run(path)
    report = _Report.model_validate(data)
    raw_pieces = report.analysis.pieces if report.analysis is not None else None
    if not raw_pieces:
        raise RunCalibrationError(f"{path}: the run has no timed pieces (it ran with --no-explain, stopped before "
                                  "the end of training, or predates them): run `moe-overlap verify` again")
    pieces = _finite_pieces(raw_pieces, str(path))
    env, cfg = report.environment, report.config
    precision = cfg.get("precision") if isinstance(cfg.get("precision"), str) else "?"
    try:
        cal, note = calibration_from_pieces(pieces, backend=env.backend, world=env.nproc, precision=precision[:20],
                                            source=f"verification run {report.out_dir or path} "
                                                   f"({report.started_at or '?'})")
    except (ValidationError, ArithmeticError) as exc:  # rates out of range: 1e-320 s, 0-byte calls
        raise RunCalibrationError(f"{path}: the run's pieces give no usable rates ({_why(exc)})") from None
    if cal is None:
        raise RunCalibrationError(f"{path}: {note}")
    device = env.device or ("cuda" if env.backend == "nccl" else "cpu")
    host_ms, _ = host_floor_input(pieces, device)
    tail = (f"; host floor {host_ms:.3f} ms per layer and micro-batch" if host_ms is not None
            else "; no host floor (CPU run: host time is compute time)" if device != "cuda"
            else "; no host floor (not recorded in this run)")
    try:
        cal = Calibration.model_validate({**cal.model_dump(), "host_ms": host_ms, "source": (cal.source + tail)[:1000]})
    except ValidationError as exc:
        raise RunCalibrationError(f"{path}: the run's host time cannot feed the estimator "
                                  f"({exc.errors()[0]['msg']})") from None
    return cal, cfg


def _why(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        return f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
    return type(exc).__name__
