"""Hardware presets the estimator reads: link bandwidths and overlap efficiencies (fabric), expert-GEMM throughput (GPU).

Torch-free. Every preset says where its number comes from: a public datasheet or paper, or a measurement
committed under benchmarks/results/ (with the command that reproduces it). Bandwidths are nominal per GPU and
per direction; the estimator multiplies them by an all-to-all efficiency (see ``DEFAULT_A2A_EFFICIENCY``).

A GPU with no measurement has no GEMM preset (pass ``--tflops``). Overlap efficiencies per link kind come from
the project's two-H200 measurement (files in ``EFFICIENCY_FILES``).
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepEP's README reports 153 GB/s (dispatch) / 158 GB/s (combine) intranode on H800 (EP8, 4096 tokens, hidden
# 7168, top-8; github.com/deepseek-ai/DeepEP). H800's NVLink is 400 GB/s bidirectional, i.e. 200 GB/s per
# direction: a tuned all-to-all reaches about 0.77 of the nominal link rate. We use 0.75 as the default.
DEFAULT_A2A_EFFICIENCY = 0.75

# Overlap efficiency beside an SM-driven all-to-all without an SM margin: the share of the 1f1b timeline's hiding
# kept, once the timeline holds the GEMMs' second wave (costs.SECOND_WAVE, measured on one H200). Re-derived from
# this project's first two-H200 round (one host, NV18 NVLink, torch 2.11, NCCL; 2026-11-29): per shape, the 1f1b
# layer pair's gain over the same layer's nodes run one after the other, over the gain the model predicts from the
# pieces timed alone in the same run at efficiency 1 (benchmarks/estimator/second_wave.py prints them;
# tests/unit/test_estimate_presets.py recomputes them). NCCL over NVLink: -0.14 / 1.21 / 1.00 at the
# Qwen3-30B-A3B / DeepSeek-V3 / DSv3-proxy shapes, median 1.00 (the second wave is the whole loss there; the small
# Qwen3 layer is host-bound and hides nothing); NCCL's network transport (an emulated inter-node link, the
# `balanced` shape): 0.82. Before the second wave was measured these were blends fitted on the same runs
# without it: 0.56 and 0.73.
EFFICIENCY_FILES = ("benchmarks/results/h200x2_2026-11-29/ep_overlap_cuda_r2.json",
                    "benchmarks/results/h200x2_2026-11-29/ep_overlap_cuda_r2_emulated-net.json")
EFFICIENCY_SOURCE = ("measured on two H200s, 2026-11-29: 1f1b vs the sequential layer over the model's gain with the "
                     "GEMMs' second wave, median over three shapes "
                     f"(NVLink, NCCL: {EFFICIENCY_FILES[0]}; network: {EFFICIENCY_FILES[1]})")
NVLINK_OVERLAP_EFFICIENCY = 1.0  # an SM-driven all-to-all beside the GEMMs, its second wave in the timeline
NETWORK_OVERLAP_EFFICIENCY = 0.82  # NCCL's network transport, its second wave in the timeline


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
    hbm_gbps: float = 0.0  # HBM peak, GB/s (datasheet): what hbm_efficiency multiplies
    hbm_source: str = ""
    device_names: tuple[str, ...] = ()  # torch.cuda.get_device_name() of this GPU (a measurement's machine.gpu)
    default_fabric: str = ""  # the fabric of the usual system with this GPU (estimate's default for --fabric)
    nvlink_domain: int = 8  # GPUs that share one NVLink domain (estimate's default for --gpus-per-node)

    def expert_tflops_for(self, model: str | None) -> float:
        return dict(self.by_model).get(model or "", self.expert_tflops)


_NV = dict(overlap_efficiency=NVLINK_OVERLAP_EFFICIENCY, efficiency_source=EFFICIENCY_SOURCE)
_NET = dict(overlap_efficiency=NETWORK_OVERLAP_EFFICIENCY, efficiency_source=EFFICIENCY_SOURCE)

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
                   efficiency_source="assumed as on H200 (SM-driven all-to-all); " + EFFICIENCY_SOURCE),
        LinkPreset("gb200-nvlink", "intra", 900.0, 15.0,
                   "NVLink 5 in a GB200 NVL72 rack: 1.8 TB/s bidirectional per GPU, one NVLink domain of 72 GPUs "
                   "(NVIDIA GB200 NVL72 datasheet)",
                   overlap_efficiency=NVLINK_OVERLAP_EFFICIENCY,
                   efficiency_source="assumed as on H200 (SM-driven all-to-all); " + EFFICIENCY_SOURCE),
        LinkPreset("ib-400g", "inter", 50.0, 30.0,
                   "one 400 Gb/s InfiniBand NIC per GPU = 50 GB/s per direction (e.g. ConnectX-7 in DGX H100/H200)",
                   **_NET),
        LinkPreset("ib-800g", "inter", 100.0, 30.0,
                   "one 800 Gb/s InfiniBand NIC per GPU = 100 GB/s per direction (e.g. ConnectX-8)", **_NET),
    )
}

# One NVIDIA H200, torch 2.11, 2026-11-29: `python benchmarks/gpu/gpu_layer.py` (benchmarks/results/gpu_layer.json).
_H200_FILE = "benchmarks/results/gpu_layer.json"
_H200_GEMM = {"qwen3-30b-a3b": 694.4, "deepseek-v3": 642.6}  # shapes.<model>.experts.raw_grouped_mm.tflops
# HBM peaks, NVIDIA datasheets. "H100 80GB HBM3" is the SXM part's device name; H100 PCIe (2.0 TB/s) and H100 NVL
# (3.9 TB/s) report other names and match no preset.
_H200_HBM = "NVIDIA H200 datasheet: 4.8 TB/s GPU memory bandwidth (H200 SXM and H200 NVL)"
_H100_HBM = "NVIDIA H100 datasheet: 3.35 TB/s GPU memory bandwidth (H100 SXM)"

GPUS: dict[str, GpuPreset] = {
    p.name: p
    for p in (
        GpuPreset("h200", _H200_GEMM["deepseek-v3"], 803.9, 4258.2,
                  f"measured on one NVIDIA H200 ({_H200_FILE}): raw torch._grouped_mm expert FFN forward + backward "
                  "694.4 TFLOP/s at the Qwen3-30B-A3B shape and 642.6 at the DeepSeek-V3 shape (the lower one for "
                  "other shapes), dense bf16 matmul 803.9 TFLOP/s, device copy 4258 GB/s",
                  by_model=tuple(_H200_GEMM.items()), hbm_gbps=4800.0, hbm_source=_H200_HBM,
                  device_names=("NVIDIA H200",), default_fabric="h200-nvlink+ib-400g"),
        GpuPreset("h100", _H200_GEMM["deepseek-v3"], 803.9, 4258.2 * 3.35 / 4.8,
                  f"derived from the H200 measurement ({_H200_FILE}): H100 SXM has the same GH100 compute "
                  "(same SMs and clocks, 989 TFLOP/s dense bf16 peak) so the GEMM rates are kept; memory bandwidth "
                  "is scaled by the HBM ratio 3.35/4.8 TB/s. Not measured on an H100",
                  by_model=tuple(_H200_GEMM.items()), hbm_gbps=3350.0, hbm_source=_H100_HBM,
                  device_names=("NVIDIA H100 80GB HBM3",), default_fabric="h100-nvlink+ib-400g"),
        # Blackwell: no measurement here. The GEMM rates are the H200's measured share of its datasheet peak
        # (642.6 / 989 = 0.65 at the DeepSeek-V3 shape, 803.9 / 989 dense) applied to the Blackwell datasheet
        # peak; memory the H200's device-copy share of HBM (4258 / 4800) applied to 8 TB/s. Derived, not measured.
        GpuPreset("b200", 642.6 / 989 * 2250, 803.9 / 989 * 2250, 4258.2 / 4800 * 8000,
                  "derived, not measured: NVIDIA HGX B200 specifications (nvidia.com/en-us/data-center/hgx: 8 GPUs, "
                  "36 PFLOPS FP16/BF16 tensor core with sparsity = 2.25 PFLOPS dense per GPU, 64 TB/s HBM3e = 8 TB/s "
                  "per GPU, NVLink 5 1.8 TB/s per GPU) x the H200's measured shares of its own peaks "
                  f"({_H200_FILE}: grouped expert GEMM 642.6 and dense 803.9 of 989 TFLOP/s, device copy 4258 of "
                  "4800 GB/s)", hbm_gbps=8000.0, hbm_source="NVIDIA HGX B200 datasheet: 8 TB/s HBM3e per GPU",
                  device_names=("NVIDIA B200",), default_fabric="b200-nvlink+ib-400g"),
        GpuPreset("gb200", 642.6 / 989 * 2500, 803.9 / 989 * 2500, 4258.2 / 4800 * 8000,
                  "derived, not measured: NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72: "
                  "360 PFLOPS FP16/BF16 tensor core with sparsity over 72 GPUs = 2.5 PFLOPS dense per GPU, 576 TB/s "
                  "HBM3e = 8 TB/s per GPU, NVLink 5 130 TB/s = 1.8 TB/s per GPU in one 72-GPU domain) x the "
                  f"H200's measured shares of its own peaks ({_H200_FILE})", hbm_gbps=8000.0,
                  hbm_source="NVIDIA GB200 NVL72 datasheet: 8 TB/s HBM3e per GPU", device_names=("NVIDIA GB200",),
                  default_fabric="gb200-nvlink+ib-400g", nvlink_domain=72),
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


def gpu_for_device(name: str) -> GpuPreset | None:
    """The preset of a GPU by its device name (a measurement's ``machine.gpu``), or None if none matches exactly."""
    return next((p for p in GPUS.values() if name.strip() in p.device_names), None)
