"""Hardware presets the estimator reads: link bandwidths (fabric) and expert-GEMM throughput (GPU).

Torch-free. Every preset says where its number comes from. Bandwidths are nominal per GPU and per
direction; the estimator multiplies them by an all-to-all efficiency (see ``DEFAULT_A2A_EFFICIENCY``).

GEMM presets are *measured* numbers (ANCHORS.md section 2, one NVIDIA H200, 2026-11-29) or derived from
them with the derivation written down; a GPU with no measurement has no preset (pass ``--tflops``).
"""

from __future__ import annotations

from dataclasses import dataclass

# DeepEP reports 153 GB/s (dispatch) / 158 GB/s (combine) intranode on H800 (EP8, 4096 tokens, hidden
# 7168, top-8; ANCHORS.md section 2). H800's NVLink is 400 GB/s bidirectional, i.e. 200 GB/s per
# direction: a tuned all-to-all reaches about 0.77 of the nominal link rate. We use 0.75 as the default.
DEFAULT_A2A_EFFICIENCY = 0.75


@dataclass(frozen=True)
class LinkPreset:
    """One kind of link, bandwidth per GPU per direction."""

    name: str
    level: str  # "intra" (inside a node) or "inter" (between nodes)
    gbps: float  # GB/s (10^9 bytes/s), nominal, per GPU, per direction
    latency_us: float  # fixed cost of one all-to-all on this level (launch + handshake), assumed
    source: str


@dataclass(frozen=True)
class GpuPreset:
    """Throughput of the expert GEMMs and of memory-bound kernels on one GPU (bf16/fp16)."""

    name: str
    expert_tflops: float  # grouped expert GEMM, TFLOP/s achieved
    dense_tflops: float  # large dense matmul, TFLOP/s achieved (attention projections)
    mem_gbps: float  # device copy bandwidth, GB/s achieved (permute / unpermute / activation)
    source: str


LINKS: dict[str, LinkPreset] = {
    p.name: p
    for p in (
        LinkPreset("h100-nvlink", "intra", 450.0, 15.0,
                   "NVLink 4: 18 links x 25 GB/s per direction = 450 GB/s per GPU (NVIDIA H100 SXM datasheet, 900 GB/s bidirectional)"),
        LinkPreset("h200-nvlink", "intra", 450.0, 15.0,
                   "NVLink 4 as on H100 (NVIDIA H200 SXM datasheet: 900 GB/s bidirectional)"),
        LinkPreset("b200-nvlink", "intra", 900.0, 15.0,
                   "NVLink 5: 1.8 TB/s bidirectional per GPU (NVIDIA B200 datasheet)"),
        LinkPreset("ib-400g", "inter", 50.0, 30.0,
                   "one 400 Gb/s InfiniBand NIC per GPU = 50 GB/s per direction (e.g. ConnectX-7 in DGX H100/H200)"),
        LinkPreset("ib-800g", "inter", 100.0, 30.0,
                   "one 800 Gb/s InfiniBand NIC per GPU = 100 GB/s per direction (e.g. ConnectX-8)"),
    )
}

GPUS: dict[str, GpuPreset] = {
    p.name: p
    for p in (
        GpuPreset("h200", 490.0, 787.0, 4200.0,
                  "measured on one NVIDIA H200, 2026-11-29 (ANCHORS.md section 2): torch._grouped_mm expert FFN at the "
                  "Qwen3-30B-A3B shape 490 TFLOP/s (633 at the DeepSeek-V3 shape), dense bf16 matmul 787 TFLOP/s, "
                  "device copy 4.2 TB/s"),
        GpuPreset("h100", 490.0, 787.0, 4200.0 * 3.35 / 4.8,
                  "derived from the H200 measurement (ANCHORS.md section 2): H100 SXM has the same GH100 compute "
                  "(same SMs and clocks, 989 TFLOP/s dense bf16 peak) so the GEMM rates are kept; memory bandwidth "
                  "is scaled by the HBM ratio 3.35/4.8 TB/s. Not measured on an H100"),
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
