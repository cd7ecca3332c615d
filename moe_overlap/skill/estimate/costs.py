"""What overlap costs, beside what it hides: the estimator's shared, physical parameters (torch-free).

Each parameter is one number used for every request and every accuracy-table row (docs/estimate.md); each
says where it comes from. None is tuned per anchor.

* Dispatcher backends: the all-to-all bandwidth of DeepEP / HybridEP is their published achieved rate; alltoall
  (NCCL) is the link preset x the all-to-all efficiency (hardware.DEFAULT_A2A_EFFICIENCY).
* Overlap efficiency by what moves the bytes: an SM-driven all-to-all over NVLink competes with the expert GEMMs
  for SMs (hardware.NVLINK_OVERLAP_EFFICIENCY); copy engines do not (COPY_ENGINE_OVERLAP_EFFICIENCY); a NIC
  moves inter-node bytes (hardware.NETWORK_OVERLAP_EFFICIENCY).
* ``CUDA_DEVICE_MAX_CONNECTIONS=1``: every stream feeds one hardware queue, so a comm kernel queued behind a
  compute kernel waits for it; of the two orders the two streams' kernels reach the queue in, only one overlaps:
  the overlap efficiency is halved (SINGLE_QUEUE_FACTOR, an argument, not a fit).
* Host work of Megatron-Core's layer (when no host time is given or calibrated): HOST_US_PER_OP x host ops per
  layer forward + backward, OPS_PER_LAYER plus OPS_PER_LOCAL_EXPERT per local expert (Transformer Engine's grouped
  GEMM issues one GEMM per expert: fc1 and fc2, forward, dgrad and wgrad). The interleaved schedule issues more
  host work per layer pair (host.HOST_FACTORS), so a host-bound layer gets slower with the overlap.
* The uncertainty band: the same model at the pessimistic and the optimistic end of the measured ranges of its
  parameters (BAND).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Our copy-engine all-to-all beside the expert GEMMs on two H200s (`--a2a ce`): 0.31 / 0.96 / 0.89 at the Qwen3 /
# DeepSeek-V3 / DSv3-proxy shapes, median 0.89 (benchmarks/results/h200x2_2026-11-29/ep_overlap_cuda_r2_ce.json,
# as hardware.EFFICIENCY_SOURCE defines it). No SM is taken from the GEMMs.
COPY_ENGINE_OVERLAP_EFFICIENCY = 0.89
COPY_ENGINE_SOURCE = ("copy-engine all-to-all on two H200s, median of three shapes "
                      "(benchmarks/results/h200x2_2026-11-29/ep_overlap_cuda_r2_ce.json)")
SINGLE_QUEUE_FACTOR = 0.5

# The second wave (skill/estimate/timeline.py, Timeline.wave): torch's persistent grouped GEMM started beside a
# kernel that holds SMs (an SM-driven all-to-all in flight, SM margin 0) took x1.72-1.83 of its time on one H200,
# at five per-rank shapes, beside 2-16 blocks that spin or copy (SECOND_WAVE_FILE; benchmarks/contention/
# gemm_beside.py). The stretch is the median minus 1; tests/unit/test_estimate_presets.py recomputes it.
SECOND_WAVE_FILE = "benchmarks/results/h200_2026-12-02_beside/gemm_beside.json"
SECOND_WAVE = 0.77

# SM margin (our layer's `--sm-margin`, ep/sm_margin.py): in a 1F1B layer pair the expert GEMMs beside an in-flight
# all-to-all leave m SMs free. What it removes: the persistent grouped GEMM's second wave beside an SM-driven
# all-to-all (its kernels already hold SMs; taken as removed, which on one H200 needed m at least twice the SMs
# those kernels hold, SECOND_WAVE_FILE), so the overlap is contention-free, as over copy engines
# (COPY_ENGINE_OVERLAP_EFFICIENCY: an argument, the all-to-all takes no SM from the GEMMs either way). What it costs:
# the GEMMs on S - m SMs, measured alone (no all-to-all beside them) on one H200 at seven per-rank shapes: the median
# slowdown per margin (SM_MARGIN_FILE; tests/unit/test_estimate_costs.py recomputes it), linear in between.
SM_MARGIN_FILE = "benchmarks/results/h200_2026-12-02_checks/gemm_rate_sm_margin.json"
SM_MARGIN_SLOWDOWN = {0: 1.0, 2: 1.007, 8: 1.042, 16: 1.069, 24: 1.109, 32: 1.157}

# Delayed wgrad's GPU cost: the deferred expert wgrad GEMMs re-read their stored inputs from HBM (no longer in L2)
# and run beside the backward dispatch (an SM-driven all-to-all takes SMs, a copy-engine one HBM bandwidth), so the
# delayed pass takes (1 + this) of its time. Fitted once: the value whose predicted 1f1b+wgrad / 1f1b step ratio
# has the median of the measured ones, over the DeepSeek-V3 and DSv3-proxy rows of the r3-r5 two-H200 layer runs
# (both transports; DELAYED_WGRAD_FILES); tests/unit/test_estimate_costs.py re-fits it.
DELAYED_WGRAD_COST = 0.10
DELAYED_WGRAD_FILES = "benchmarks/results/h200x2_2026-11-29_r[345]/*ep_overlap*.json (deepseek-v3, dsv3-proxy)"

# Host issue cost per op: our EP-2 layer issues about 370 host ops per forward + backward (docs/benchmarks.md,
# "Where the time goes at EP 2") in a median 6.21 ms (host_ms of the 30 no-overlap rows that record it: the
# three NVLink shapes of the ten NVLink layer runs in benchmarks/results/h200x2_2026-11-29_r3..r5;
# tests/unit/test_estimate_costs.py recomputes it): 16.8 us per op on that host (Python, PyTorch eager).
HOST_US_PER_OP = 16.8
OPS_PER_LAYER = 370  # ours, which issues its expert GEMMs as one grouped launch each
OPS_PER_LOCAL_EXPERT = 6  # one GEMM launch per expert: fc1 and fc2 x forward, dgrad, wgrad


@dataclass(frozen=True)
class Backend:
    name: str
    intra_gbps: float | None  # achieved GB/s per GPU (None: the link preset x the all-to-all efficiency)
    inter_gbps: float | None
    copy_like: bool  # moves bytes without taking the GEMMs' SMs (TMA / copy engines)
    source: str


BACKENDS = {
    "alltoall": Backend("alltoall", None, None, False,
                        "NCCL all-to-all (SM kernels): the link preset x the all-to-all efficiency"),
    "deepep": Backend("deepep", 153.0, 58.0, False,
                      "DeepEP README (github.com/deepseek-ai/DeepEP): normal kernels, intranode dispatch 153 GB/s "
                      "(NVLink, H800, EP 8), internode dispatch 58 GB/s (RDMA, EP 32); SM kernels (20 SMs)"),
    "hybridep": Backend("hybridep", 153.0, 58.0, True,
                        "HybridEP (DeepEP's hybrid-ep branch, docs/README_Hybrid-EP.md): TMA intranode, RDMA "
                        "internode, few SMs; no per-GPU bandwidth verified here, so DeepEP's published rates"),
}

# (pessimistic, optimistic) multipliers of the overlap efficiency and of the host factors' excess over 1: the
# measured ranges (NVLink efficiency -0.14..1.21 around 1.00 with the second wave, -0.08..0.69 around 0.56 without;
# network 0.82 (0.73..0.91 without); NCCL host factors 1.12-1.22 and
# 1.15-1.30 around 1.177 / 1.214, copy engines 1.07-1.15 and 1.08-1.14 around 1.109 / 1.112: host.py).
BAND = {"efficiency": (0.5, 1.25), "host_excess": (1.9, 0.45)}


GraphScope = Literal["full_iteration", "attn", "mlp", "moe", "moe_router", "moe_preprocess", "mamba"]
# CUDA graphs (Megatron-Core's cuda_graph_scope, transformer/enums.py CudaGraphScope) replace a captured part's host
# ops by one replay: our EP 1 layer captured whole issued 55 host ops per forward + backward instead of 328 (Qwen3
# shape, GRAPH_FILE; docs/benchmarks.md "fifth round"), so a captured part keeps GRAPH_HOST_KEEP of its host work.
GRAPH_FILE = "benchmarks/results/h200x2_2026-11-29_r5/call4_gpu_layer_graph_1.json"
GRAPH_HOST_KEEP = 0.168  # 55 / 328; recomputed from GRAPH_FILE by tests/unit/test_estimate_costs.py
# Which share of the modelled host ops (per layer, per local expert) each scope captures. The router's and the
# preprocess's shares are their aten ops (SCOPE_OPS) over all aten ops of our EP 1 layer (HOST_OPS_FILE): 18 and 3
# of 179. attn / mlp / mamba capture no op the MoE layer's count holds (attention's host work is not modelled).
HOST_OPS_FILE = "benchmarks/results/h200x2_2026-11-29_r5/call1_host_ops_main.json"
SCOPE_OPS = {"moe_router": ("mm", "softmax", "_softmax", "_softmax_backward_data", "topk", "gather",
                            "gather_backward", "mean", "div", "sum", "scatter_add_"),
             "moe_preprocess": ("cumsum", "index_select")}
GRAPH_SHARES = {"full_iteration": (1.0, 1.0), "moe": (1.0, 1.0), "moe_router": (0.101, 0.0),
                "moe_preprocess": (0.017, 0.0), "attn": (0.0, 0.0), "mlp": (0.0, 0.0), "mamba": (0.0, 0.0)}


def _graphed(scopes: list[str] | None) -> tuple[float, float]:
    """(per-layer, per-expert) share of the host ops the scopes capture."""
    per_layer = per_expert = 0.0
    for name in set(scopes or ()):
        a, b = GRAPH_SHARES[name]
        per_layer, per_expert = per_layer + a, per_expert + b
    return min(1.0, per_layer), min(1.0, per_expert)


def host_ms_megatron(experts: int, ep: int, graph_scope: list[str] | None = None) -> float:
    """Host issue time of one Megatron-Core MoE layer's forward + backward (ms), from its op count; CUDA-graphed
    parts keep GRAPH_HOST_KEEP of their ops."""
    a, b = _graphed(graph_scope)
    cut = 1.0 - GRAPH_HOST_KEEP
    ops = OPS_PER_LAYER * (1 - a * cut) + OPS_PER_LOCAL_EXPERT * (experts // ep) * (1 - b * cut)
    return HOST_US_PER_OP * ops / 1e3


def host_source(experts: int, ep: int, graph_scope: list[str] | None = None) -> str:
    graphs = (f"; CUDA graphs on {', '.join(sorted(set(graph_scope)))} keep {GRAPH_HOST_KEEP:g} of the captured "
              "ops" if graph_scope else "")
    return (f"host issue time estimated from op counts: {HOST_US_PER_OP:g} us x ({OPS_PER_LAYER} + "
            f"{OPS_PER_LOCAL_EXPERT} x {experts // ep} local experts){graphs} = "
            f"{host_ms_megatron(experts, ep, graph_scope):.2f} ms per layer and micro-batch (skill/estimate/costs.py;"
            " give host_ms to use a measured one)")


def gemm_margin_slowdown(margin: int) -> float:
    """The expert GEMMs' time on SMs - `margin` SMs over their time on all (SM_MARGIN_SLOWDOWN, linear between the
    measured margins); ValueError past the largest measured one."""
    points = sorted(SM_MARGIN_SLOWDOWN.items())
    if margin > points[-1][0]:
        raise ValueError(f"measured up to {points[-1][0]} SMs")
    for (m0, s0), (m1, s1) in zip(points, points[1:], strict=False):
        if m0 <= margin <= m1:
            return s0 + (s1 - s0) * (margin - m0) / (m1 - m0)
    return 1.0


def second_wave(backend: str, a2a_engine: str, sm_margin: int) -> float:
    """The 1f1b pair's GEMM stretch beside an all-to-all in flight: SECOND_WAVE for an SM-driven one without an
    SM margin, else 0 (copy engines and copy-like backends take no SM; a margin leaves the all-to-all its own)."""
    sm_driven = not (a2a_engine == "copy-engine" or BACKENDS[backend].copy_like)
    return SECOND_WAVE if sm_driven and not sm_margin else 0.0


def overlap_efficiency(base: float, *, multi_node: bool, backend: str, a2a_engine: str,
                       max_connections: int | None, sm_margin: int = 0) -> tuple[float, str]:
    """The overlap efficiency after what moves the bytes, the GEMMs' SM margin and the hardware queues; and why."""
    eff, why = base, []
    sm_driven = not (a2a_engine == "copy-engine" or BACKENDS[backend].copy_like)
    if not multi_node and not sm_driven:
        eff = COPY_ENGINE_OVERLAP_EFFICIENCY
        why.append(f"bytes moved without the GEMMs' SMs: {eff:g} ({COPY_ENGINE_SOURCE})")
    elif sm_margin and sm_driven:
        eff = COPY_ENGINE_OVERLAP_EFFICIENCY
        why.append(f"SM margin {sm_margin}: the all-to-all kernels keep SMs of their own beside the GEMMs (no second "
                   f"wave, ep/sm_margin.py), so the overlap is the contention-free copy-engine one: {eff:g}")
    if max_connections == 1:
        eff *= SINGLE_QUEUE_FACTOR
        why.append(f"CUDA_DEVICE_MAX_CONNECTIONS=1: one hardware queue, efficiency x {SINGLE_QUEUE_FACTOR:g}")
    return eff, "; ".join(why)


def micro_batches_from(global_batch: int | None, micro_batch_size: int | None, dp: int | None
                       ) -> tuple[int | None, str]:
    """Micro-batches per step and DP rank, or (None, why not)."""
    if global_batch is None and dp is None:
        return None, ""
    if global_batch is None or dp is None:
        return None, "give both global_batch and dp (and micro_batch_size, default 1)"
    mbs = micro_batch_size or 1
    if global_batch % (mbs * dp):
        return None, f"global_batch {global_batch} is not a multiple of micro_batch_size x dp = {mbs * dp}"
    return global_batch // (mbs * dp), ""


def memory_note(micro_batches: int, layers: int) -> str:
    return ("1f1b keeps the forward of micro-batch k+1 alive beside the backward of micro-batch k: at the pairing "
            f"about one more layer's activations of {layers} at pipeline size 1, and one more micro-batch in "
            "flight per pipeline stage with PP > 1 (Megatron-Core's extra warm-up forward); Megatron-LM PR 6311 "
            "measured +364 MB (+0.6%) with full recompute; check the headroom"
            + ("" if micro_batches >= 2 else "; with one micro-batch nothing is paired"))
