"""Request and result models of the overlap-benefit estimator (torch-free, pydantic v2).

The result is what the CLI prints as JSON and the MCP tool ``estimate_overlap_benefit`` returns.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from moe_overlap.skill.estimate.costs import GraphScope
from moe_overlap.skill.estimate.models import MODELS, model_preset

BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
# Limits far beyond any real job that keep every product in the cost model finite and the timelines short
# (docs/limits.md): rates between 1e-6 and 1e6-1e7 of their unit, times up to 1e6 ms, sizes up to 2^20 - 2^24.
MIN_RATE, MAX_RATE = 1e-6, 1e6
MAX_MS = 1e6
MAX_DIM = 1 << 20  # hidden, FFN
MAX_TOKENS = 1 << 24
MAX_EXPERTS = 65_536
MAX_LAYERS = 1024
MAX_MICRO_BATCHES = 65_536
MAX_CHUNKS = 64
# The estimator counts 2*D elements per routed token for a gather pass; a fused gather that reads each token once for
# its K rows moves (1 + 1/K)*D, never less than half of that: an achieved share of the HBM peak in the estimator's
# accounting stays below 2.
MAX_HBM_EFFICIENCY = 2.0


class MemoryEfficiency(BaseModel):
    """Achieved rates of the memory-bound passes, each as a share of the HBM peak of the GPU it was measured on,
    with the bytes counted as the estimator counts them (``_per_layer`` in api.py): a fused kernel that moves fewer
    bytes than counted can exceed 1. Measured at one GPU, applied to another's HBM peak."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    gather: float = Field(gt=0, le=MAX_HBM_EFFICIENCY, description="permute and unpermute (row gathers with the "
                          "routing weights), 2*D elements per routed token per pass")
    sort: float = Field(gt=0, le=MAX_HBM_EFFICIENCY, description="sort and unsort by local expert (row copies), "
                        "2*D elements per routed token per pass")
    activation: float = Field(gt=0, le=MAX_HBM_EFFICIENCY, description="SwiGLU forward + backward, 8*F elements "
                              "per routed token")
    wgrad: float = Field(gt=0, le=MAX_HBM_EFFICIENCY, description="weight-gradient accumulation, 3 accesses per "
                         "local expert weight")
    source: str = Field("given", max_length=1000, description="where the shares were measured")

    @classmethod
    def uniform(cls, share: float, source: str = "given") -> MemoryEfficiency:
        return cls(gather=share, sort=share, activation=share, wgrad=share, source=source)


class Calibration(BaseModel):
    """Numbers measured on this machine by ``moe_overlap.verify.calibrate`` (our own implementation)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    expert_tflops: float = Field(ge=MIN_RATE, le=MAX_RATE, description="grouped expert GEMM rate, TFLOP/s")
    dense_tflops: float = Field(ge=MIN_RATE, le=MAX_RATE, description="plain matmul rate, TFLOP/s")
    mem_gbps: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE * 10,
                                   description="row gather (index_select) rate, bytes read + written, "
                                   "GB/s; None: not measured (a verification run's pieces count those kernels in "
                                   "the attention/other time instead)")
    perm_ns_per_elem: float | None = Field(None, ge=0, le=MAX_RATE, description="gathers and weighting (permute, sort, "
                                           "unsort, unpermute), forward + backward, ns per routed token per D element")
    act_ns_per_elem: float | None = Field(None, ge=0, le=MAX_RATE, description="SwiGLU forward + backward cost per routed "
                                          "token per F element, ns (our kernels, not fused)")
    wgrad_ns_per_weight: float | None = Field(None, ge=0, le=MAX_RATE, description="cost per local expert weight element of one "
                                              "weight-gradient pass (written whatever the rows), ns")
    a2a_gbps: float = Field(ge=MIN_RATE, le=MAX_RATE, description="all-to-all bandwidth per rank per direction (already achieved)")
    a2a_latency_us: float = Field(ge=0, le=MAX_MS * 1000, description="fixed cost of one all-to-all")
    overlap_efficiency: float = Field(ge=0, le=1, description="share of the shorter of (a2a, matmul) hidden "
                                      "when both run at once")
    overhead_ms: float = Field(0.0, ge=0, le=MAX_MS, description="fixed host cost of one MoE layer fwd+bwd (python, small ops)")
    host_ms: float | None = Field(None, gt=0, le=MAX_MS, description="host issue time of one MoE layer's forward + "
                                  "backward without overlap (ms, median): the floor of a host-bound layer; None: "
                                  "not measured (no floor)")
    source: str = Field(max_length=1000, description="machine, backend, world size, date")


class EstimateRequest(BaseModel):
    """One MoE shape, parallel layout and hardware. Sizes are per rank; times in ms."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # inf would print as JSON-invalid Infinity

    model: str | None = Field(None, max_length=100, description="model preset (shapes from its public config): "
                                                + ", ".join(sorted(MODELS)) + "; fills hidden, moe_ffn, experts, "
                                                "topk, layers and the attention time unless given")
    hidden: int | None = Field(None, gt=0, le=MAX_DIM, description="hidden size D (required unless model is given)")
    moe_ffn: int | None = Field(None, gt=0, le=MAX_DIM, description="expert FFN hidden size F (w1 is [D, 2F], w2 is "
                                "[F, D]); required unless model is given")
    experts: int | None = Field(None, gt=0, le=MAX_EXPERTS, description="number of routed experts E (required unless "
                                "model is given)")
    topk: int | None = Field(None, gt=0, le=MAX_EXPERTS, description="experts per token K (required unless model is "
                             "given)")
    tokens: int | None = Field(None, gt=0, le=MAX_TOKENS, description="tokens per rank per micro-batch (sequence "
                               "length x micro-batch size); default: a model preset's sequence length x "
                               "micro_batch_size")
    seq_length: int | None = Field(None, gt=0, le=MAX_TOKENS, description="sequence length for a model preset's "
                                   "causal attention (default: tokens, i.e. micro-batch size 1)")
    ep: int | None = Field(None, gt=0, le=MAX_EXPERTS, description="expert-parallel degree N (required)")
    micro_batches: int | None = Field(None, gt=0, le=MAX_MICRO_BATCHES, description="micro-batches per step and "
                                      "data-parallel rank (1f1b needs >= 2); default: global_batch / "
                                      "(micro_batch_size x dp) when those are given, else 1")
    global_batch: int | None = Field(None, gt=0, le=MAX_TOKENS, description="global batch size in sequences")
    micro_batch_size: int | None = Field(None, gt=0, le=MAX_TOKENS, description="sequences per micro-batch "
                                         "(default 1)")
    dp: int | None = Field(None, gt=0, le=MAX_TOKENS, description="data-parallel size (GPUs / (TP x PP x CP))")
    dispatcher: Literal["alltoall", "deepep", "hybridep"] = Field(
        "alltoall", description="token dispatcher: alltoall (NCCL all-to-all), or flex with the DeepEP or "
        "HybridEP backend (their published bandwidths, skill/estimate/costs.py)")
    cuda_device_max_connections: int | None = Field(None, ge=1, le=32, description="CUDA_DEVICE_MAX_CONNECTIONS "
                                                    "of the job (1 puts every stream on one hardware queue)")
    cuda_graph_scope: list[GraphScope] | None = Field(None, description="Megatron-Core's "
                                                      "cuda_graph_scope: graphed parts issue a fraction of their "
                                                      "host ops (skill/estimate/costs.py)")
    a2a_engine: Literal["sm", "copy-engine"] = Field("sm", description="what moves the all-to-all bytes: SM "
                                                     "kernels (NCCL, DeepEP, HybridEP) or copy engines")
    sm_margin: int = Field(0, ge=0, le=1024, description="SMs the expert GEMMs of a 1f1b layer pair leave to the "
                           "all-to-all kernels beside them (our layer's --sm-margin; 0: off; measured up to 32): the GEMMs run on fewer "
                           "SMs (measured slowdown), an SM-driven all-to-all beside them no longer stalls them "
                           "(skill/estimate/costs.py)")
    pp: int = Field(1, gt=0, le=MAX_LAYERS, description="pipeline-parallel size: its bubble, (pp - 1) / (vpp x "
                    "micro_batches) of the layers' time, is added to every schedule, never hidden")
    vpp: int = Field(1, gt=0, le=MAX_LAYERS, description="virtual pipeline stages per rank (interleaved schedule)")
    recompute: Literal["none", "full"] = Field("none", description="full: every layer's forward is recomputed "
                                               "in its backward (Megatron-LM PR 6311's per-layer recompute)")
    layers: int = Field(1, gt=0, le=MAX_LAYERS, description="MoE layers (step times scale with it)")
    gpus_per_node: int | None = Field(None, gt=0, le=MAX_EXPERTS, description="GPUs per node (NVLink domain) "
                                      "that the EP group is packed into (sets the intra/inter-node split); "
                                      "default: the gpu_preset's NVLink domain, else 8")
    ep_stride: int = Field(1, gt=0, le=MAX_EXPERTS, description="GPUs between consecutive ranks of one EP group "
                           "(the EP group's placement): TP x CP with Megatron-Core's default rank order "
                           "tp-cp-ep-dp-pp, so gpus_per_node / ep_stride EP ranks share a node")
    precision: Literal["bf16", "fp16", "fp32"] = "bf16"
    fabric: str | None = Field(None, max_length=200, description="link presets, e.g. 'h100-nvlink+ib-400g'")
    intra_gbps: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="intra-node GB/s per GPU per direction (overrides fabric)")
    inter_gbps: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="inter-node GB/s per GPU per direction (overrides fabric)")
    a2a_efficiency: float | None = Field(None, gt=0, le=1, description="achieved fraction of link bandwidth")
    gpu_preset: str | None = Field(None, max_length=100, description="GEMM/memory throughput preset (h100, h200)")
    tflops: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="expert GEMM TFLOP/s (overrides the preset)")
    dense_tflops: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE, description="router/dense GEMM TFLOP/s (default: tflops)")
    mem_gbps: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE * 10, description="memory-bound kernel GB/s (permute, activation)")
    hbm_efficiency: float | MemoryEfficiency | None = Field(
        None, description="achieved share of the GPU's HBM peak (hbm_gbps, or the gpu_preset's) by the "
        "memory-bound passes: one number for all, or one per kind of pass (as `--mem-rate FILE` measures them); "
        "replaces the preset's device-copy rate")
    hbm_gbps: float | None = Field(None, ge=MIN_RATE, le=MAX_RATE * 10, description="HBM peak of the GPU, GB/s "
                                   "(default: the gpu_preset's datasheet value); only with hbm_efficiency")
    attn_ms: float | None = Field(None, ge=0, le=MAX_MS, description="attention/dense forward time per layer per "
                                  "micro-batch; default: a model preset's attention FLOPs at the dense rate, else 0")
    overhead_ms: float | None = Field(None, ge=0, le=MAX_MS, description="fixed host cost per layer per micro-batch (fwd+bwd); "
                                      "default: the calibration's, else 0")
    host_ms: float | None = Field(None, gt=0, le=MAX_MS, description="host issue time of one MoE layer's forward + "
                                  "backward per micro-batch without overlap (ms): no schedule is faster than the "
                                  "host issuing it (skill/estimate/host.py); default: the calibration's, else no floor")
    megatron_host: bool = Field(True, description="without host_ms or a calibration, estimate Megatron-Core's "
                                "host issue time from its op count (skill/estimate/costs.py); false: no host floor")
    baseline_step_ms: float | None = Field(None, gt=0, le=MAX_MS * 1000, description="the measured step time of "
                                           "the job without overlap: what the model leaves out of it (optimizer, "
                                           "gradient reduction, embedding, loss, uneven routing) is added to every "
                                           "schedule, never hidden")
    other_ms: float = Field(0.0, ge=0, le=MAX_MS, description="time per step outside the layers, never overlapped")
    chunks: int = Field(4, ge=2, le=MAX_CHUNKS, description="token chunks of the 'chunked' schedule")
    chunk_backward: bool = Field(True, description="the chunked schedule also pipelines the backward pass")
    overlap_efficiency: float | None = Field(None, ge=0, le=1,
                                             description="1: overlapped comm costs compute nothing; 0: no overlap")
    calibration: Calibration | None = None

    @field_validator("hbm_efficiency", mode="before")
    @classmethod
    def _one_share(cls, v: Any) -> MemoryEfficiency | None:
        """A number is the share of every kind of pass; an object gives each kind its own. Errors name the key."""
        if v is None or isinstance(v, MemoryEfficiency):
            return v
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            if not 0 < v <= MAX_HBM_EFFICIENCY:
                raise ValueError(f"must be > 0 and <= {MAX_HBM_EFFICIENCY:g}")
            return MemoryEfficiency.uniform(float(v))
        if not isinstance(v, dict):
            raise ValueError("must be a number (the share of every pass) or an object with gather, sort, "
                             "activation, wgrad")
        try:
            return MemoryEfficiency.model_validate(v)
        except ValidationError as exc:
            e = exc.errors()[0]
            raise ValueError(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}") from None

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | None) -> str | None:
        return None if v is None else model_preset(v).name  # ValueError names the choices

    @model_validator(mode="after")
    def _from_model(self) -> EstimateRequest:
        if self.model is not None:
            p = model_preset(self.model)
            for name in ("hidden", "moe_ffn", "experts", "topk"):
                if getattr(self, name) is None:
                    setattr(self, name, getattr(p, name))
            if "layers" not in self.model_fields_set:
                self.layers = p.layers
        return self


def ep_per_node(req: EstimateRequest) -> int:
    """EP ranks that share one node (NVLink domain) given the group's placement."""
    return max(1, (req.gpus_per_node or 8) // req.ep_stride)


class ResolvedHardware(BaseModel):
    """The rates the estimate used, after presets, explicit values and calibration were merged."""

    expert_tflops: float
    dense_tflops: float
    mem_gbps: float | None = Field(description="memory-bound GB/s of every pass (of the sort/unsort copies when "
                                   "mem_efficiency is set); None: memory-bound passes not modelled")
    hbm_gbps: float | None = Field(None, description="HBM peak the memory efficiencies apply to; None: not used")
    mem_efficiency: MemoryEfficiency | None = Field(None, description="shares of hbm_gbps per kind of "
                                                    "memory-bound pass; None: mem_gbps for every pass")
    intra_gbps: float = Field(description="achieved intra-node all-to-all GB/s (nominal x efficiency, or calibrated)")
    inter_gbps: float | None
    a2a_efficiency: float = Field(description="applied to nominal (preset or explicit) bandwidths, not to calibrated ones")
    perm_ns_per_elem: float | None = Field(description="calibrated gather cost; None: 16*D elements at mem_gbps")
    act_ns_per_elem: float | None = Field(description="calibrated SwiGLU cost; None: fused kernel at mem_gbps")
    wgrad_ns_per_weight: float | None = Field(description="calibrated; None: 3 accesses per weight at mem_gbps")
    overhead_ms: float
    host_ms: float | None = Field(None, description="host issue time per layer and micro-batch (no overlap); "
                                  "None: no host floor")
    intra_latency_us: float
    inter_latency_us: float
    overlap_efficiency: float
    efficiency_source: str = Field("", description="where the overlap efficiency comes from")
    second_wave: float = Field(0.0, description="GEMM stretch beside an in-flight all-to-all (costs.SECOND_WAVE)")
    sources: list[str]


class PerLayer(BaseModel):
    """One MoE layer, one micro-batch, one rank."""

    routed_tokens: int
    expert_gflop_fwd: float
    expert_gflop_dgrad: float
    expert_gflop_wgrad: float
    a2a_bytes: int = Field(description="bytes one all-to-all sends off the rank")
    a2a_intra_bytes: int
    a2a_inter_bytes: int
    a2a_ms: float = Field(description="link time of one all-to-all, latency excluded")
    a2a_latency_ms: float
    expert_fwd_ms: float = Field(description="expert GEMMs forward (dgrad and wgrad take the same each)")
    router_fwd_ms: float
    permute_ms: float = Field(description="row gathers with the routing weights (permute, unpermute), forward + "
                              "backward")
    sort_ms: float = Field(description="row copies by local expert (sort, unsort), forward + backward")
    activation_ms: float = Field(description="SwiGLU elementwise work, forward + backward")
    wgrad_write_ms: float = Field(description="writing + accumulating the local experts' weight gradients, per "
                                  "wgrad pass (a chunked backward pays it once per chunk)")
    attn_fwd_ms: float = Field(description="attention forward per layer and micro-batch (given, or a model "
                                           "preset's FLOPs at the dense rate)")
    overhead_ms: float


class ScheduleEstimate(BaseModel):
    name: Literal["none", "1f1b", "1f1b+wgrad"]
    step_ms: float
    compute_ms: float = Field(description="busy time of the compute stream")
    comm_ms: float = Field(description="busy time of the comm stream")
    exposed_comm_ms: float = Field(description="GPU timeline time not covered by compute")
    host_bound: bool = Field(False, description="the step is the host's issue time, not the GPU timeline")
    speedup: float = 1.0
    speedup_low: float = Field(1.0, description="speedup at the pessimistic end of the model's parameters")
    speedup_high: float = Field(1.0, description="speedup at the optimistic end of the model's parameters")
    available: bool = True
    note: str = ""


class EstimateResult(BaseModel):
    request: EstimateRequest
    hardware: ResolvedHardware
    per_layer: PerLayer
    schedules: list[ScheduleEstimate]
    comm_share: float = Field(description="all-to-all share of the step without overlap")
    recommended_schedule: str
    predicted_speedup: float
    recommendation: Literal["use", "measure first", "gain likely negligible", "avoid"]
    reasons: list[str]
    measure_next: list[str] = Field(default_factory=list, description="what to measure before deciding")
    memory: str = Field("", description="what the overlap costs in memory")
    assumptions: list[str]
