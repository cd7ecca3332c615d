"""Hardware presets the estimator reads: link bandwidths and overlap efficiencies (fabric), expert-GEMM throughput (GPU).

Torch-free. Every preset says where its number comes from: a public datasheet or paper, or a measurement
committed under benchmarks/results/ (with the command that reproduces it). Bandwidths are nominal per GPU and
per direction; the estimator multiplies them by an all-to-all efficiency (see ``DEFAULT_A2A_EFFICIENCY``).

A GPU with no measurement has no GEMM preset (pass ``--tflops``). Overlap efficiencies per link kind marked
``provisional`` come from a project measurement whose result file is not committed yet: they say so, and name
the command that will commit it.
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepEP's README reports 153 GB/s (dispatch) / 158 GB/s (combine) intranode on H800 (EP8, 4096 tokens, hidden
# 7168, top-8; github.com/deepseek-ai/DeepEP). H800's NVLink is 400 GB/s bidirectional, i.e. 200 GB/s per
# direction: a tuned all-to-all reaches about 0.77 of the nominal link rate. We use 0.75 as the default.
DEFAULT_A2A_EFFICIENCY = 0.75

# Overlap efficiency (share of the shorter of communication and compute hidden when both run at once) per kind
# of link. Provisional until the two-GPU results are committed: measured by the project on two H200s (one host,
# NV18 NVLink, torch 2.11, 2026-11-29): an NCCL all_to_all_single of a DeepSeek-V3-proxy dispatch (0.82 ms
# alone) beside a compute-bound grouped GEMM (2.50 ms alone) took 3.51 ms, more than the two one after the other
# (3.32 ms): nothing hidden. The same over NCCL's network transport (NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, an
# emulated inter-node link) hid the GEMM completely.
PROVISIONAL_EFFICIENCY_SOURCE = ("provisional: project measurement on two H200s (NVLink), 2026-11-29, result file "
                                 "not committed yet; `bash benchmarks/run_multi_gpu.sh` on a two-GPU machine "
                                 "reproduces it under benchmarks/results/")
NVLINK_OVERLAP_EFFICIENCY = 0.0  # an SM-driven all-to-all beside compute-bound GEMMs
NETWORK_OVERLAP_EFFICIENCY = 1.0  # a NIC (or NCCL's network transport) moves the bytes: no SM taken


@dataclass(frozen=True)
class LinkPreset:
    """One kind of link, bandwidth per GPU per direction."""

    name: str
    level: str  # "intra" (inside a node) or "inter" (between nodes)
    gbps: float  # GB/s (10^9 bytes/s), nominal, per GPU, per direction
    latency_us: float  # fixed cost of one all-to-all on this level (launch + handshake), assumed
    source: str
    overlap_efficiency: float = 1.0  # hidden share of the shorter of comm and compute when both run at once
    efficiency_source: str = ""


@dataclass(frozen=True)
class GpuPreset:
    """Throughput of the expert GEMMs and of memory-bound kernels on one GPU (bf16/fp16)."""

    name: str
    expert_tflops: float  # grouped expert GEMM forward + backward, TFLOP/s achieved (shapes not measured)
    dense_tflops: float  # large dense matmul, TFLOP/s achieved (attention projections)
    mem_gbps: float  # device copy bandwidth, GB/s achieved (permute / unpermute / activation)
    source: str
    by_model: tuple[tuple[str, float], ...] = ()  # expert TFLOP/s measured at a model preset's own shape

    def expert_tflops_for(self, model: str | None) -> float:
        return dict(self.by_model).get(model or "", self.expert_tflops)


_NV = dict(overlap_efficiency=NVLINK_OVERLAP_EFFICIENCY, efficiency_source=PROVISIONAL_EFFICIENCY_SOURCE)
_NET = dict(overlap_efficiency=NETWORK_OVERLAP_EFFICIENCY, efficiency_source=PROVISIONAL_EFFICIENCY_SOURCE)

LINKS: dict[str, LinkPreset] = {
    p.name: p
    for p in (
        LinkPreset("h100-nvlink", "intra", 450.0, 15.0,
                   "NVLink 4: 18 links x 25 GB/s per direction = 450 GB/s per GPU (NVIDIA H100 SXM datasheet, 900 GB/s bidirectional)",
                   **_NV),
        LinkPreset("h200-nvlink", "intra", 450.0, 15.0,
                   "NVLink 4 as on H100 (NVIDIA H200 SXM datasheet: 900 GB/s bidirectional)", **_NV),
        LinkPreset("b200-nvlink", "intra", 900.0, 15.0,
                   "NVLink 5: 1.8 TB/s bidirectional per GPU (NVIDIA B200 datasheet)",
                   overlap_efficiency=NVLINK_OVERLAP_EFFICIENCY,
                   efficiency_source="assumed as on H200 (SM-driven all-to-all); " + PROVISIONAL_EFFICIENCY_SOURCE),
        LinkPreset("ib-400g", "inter", 50.0, 30.0,
                   "one 400 Gb/s InfiniBand NIC per GPU = 50 GB/s per direction (e.g. ConnectX-7 in DGX H100/H200)",
                   **_NET),
        LinkPreset("ib-800g", "inter", 100.0, 30.0,
                   "one 800 Gb/s InfiniBand NIC per GPU = 100 GB/s per direction (e.g. ConnectX-8)", **_NET),
    )
}

# One NVIDIA H200, torch 2.11, 2026-11-29: `python benchmarks/gpu_layer.py` (benchmarks/results/gpu_layer.json).
_H200_FILE = "benchmarks/results/gpu_layer.json"
_H200_GEMM = {"qwen3-30b-a3b": 694.4, "deepseek-v3": 642.6}  # shapes.<model>.experts.raw_grouped_mm.tflops

GPUS: dict[str, GpuPreset] = {
    p.name: p
    for p in (
        GpuPreset("h200", _H200_GEMM["deepseek-v3"], 803.9, 4258.2,
                  f"measured on one NVIDIA H200 ({_H200_FILE}): raw torch._grouped_mm expert FFN forward + backward "
                  "694.4 TFLOP/s at the Qwen3-30B-A3B shape and 642.6 at the DeepSeek-V3 shape (the lower one for "
                  "other shapes), dense bf16 matmul 803.9 TFLOP/s, device copy 4258 GB/s",
                  by_model=tuple(_H200_GEMM.items())),
        GpuPreset("h100", _H200_GEMM["deepseek-v3"], 803.9, 4258.2 * 3.35 / 4.8,
                  f"derived from the H200 measurement ({_H200_FILE}): H100 SXM has the same GH100 compute "
                  "(same SMs and clocks, 989 TFLOP/s dense bf16 peak) so the GEMM rates are kept; memory bandwidth "
                  "is scaled by the HBM ratio 3.35/4.8 TB/s. Not measured on an H100",
                  by_model=tuple(_H200_GEMM.items())),
    )
}


class PresetError(ValueError):
    """Unknown preset name; carries the field and the valid choices."""

    def __init__(self, field: str, value: str, choices: list[str], hint: str = ""):
        self.field = field
        self.choices = choices
        msg = f"{field}: unknown preset {value!r}; choose one of {', '.join(choices)}"
        super().__init__(msg + (f". {hint}" if hint else ""))


def parse_fabric(spec: str) -> tuple[LinkPreset | None, LinkPreset | None]:
    """``"h100-nvlink+ib-400g"`` -> (intra preset, inter preset); either part may be left out."""
    intra = inter = None
    for part in (p.strip().lower() for p in spec.split("+")):
        if not part:
            continue
        if part not in LINKS:
            raise PresetError("fabric", part, sorted(LINKS),
                              "Combine one intra-node and one inter-node preset with '+', e.g. h100-nvlink+ib-400g")
        preset = LINKS[part]
        if preset.level == "intra":
            if intra is not None:
                raise PresetError("fabric", spec, sorted(LINKS), "give at most one intra-node (nvlink) preset")
            intra = preset
        else:
            if inter is not None:
                raise PresetError("fabric", spec, sorted(LINKS), "give at most one inter-node (ib) preset")
            inter = preset
    if intra is None and inter is None:
        raise PresetError("fabric", spec, sorted(LINKS))
    return intra, inter


def gpu_preset(name: str) -> GpuPreset:
    key = name.strip().lower()
    if key not in GPUS:
        raise PresetError("gpu_preset", name, sorted(GPUS),
                          "GPUs without a measured number have no preset: pass tflops (and mem_gbps) explicitly")
    return GPUS[key]
