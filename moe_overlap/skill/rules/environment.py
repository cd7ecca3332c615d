"""The software and hardware a config will run on: torch, Transformer Engine, GPU, CUDA_DEVICE_MAX_CONNECTIONS.

Read without importing torch or TE (package metadata and ``nvidia-smi``), so validation stays fast and
torch-free. Every item can be given instead, so an assistant can validate for a target cluster from a laptop.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal

from pydantic import BaseModel, Field

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.rules.versions import installed_version, is_version_number, parse_version

Source = Literal["given", "detected", "unknown"]

# GPU product -> compute capability (NVIDIA's CUDA GPUs table). Matched on whole words of the name.
GPU_CAPABILITY: dict[str, str] = {
    "V100": "7.0", "T4": "7.5", "A100": "8.0", "A800": "8.0", "A30": "8.0", "A10": "8.6", "A40": "8.6",
    "A6000": "8.6", "3090": "8.6", "L4": "8.9", "L40": "8.9", "L40S": "8.9", "4090": "8.9",
    "H100": "9.0", "H800": "9.0", "H200": "9.0", "H20": "9.0", "GH200": "9.0",
    "B200": "10.0", "GB200": "10.0", "B300": "10.3", "GB300": "10.3",
}
NVIDIA_SMI_TIMEOUT_S = 3.0  # nvidia-smi can hang on a wedged driver; validation must not


class Environment(BaseModel):
    """What the checks ran against. `*_source` says whether a value was given, detected or is unknown."""

    torch_version: str | None = None
    torch_version_source: Source = "unknown"
    te_version: str | None = Field(None, description="Transformer Engine")
    te_version_source: Source = "unknown"
    gpu_name: str | None = None
    compute_capability: str | None = Field(None, description='e.g. "9.0"')
    gpu_source: Source = "unknown"
    cuda_device_max_connections: str | None = Field(None, description="None: unset (CUDA's default, 8)")
    megatron_core_version: str | None = Field(None, description="installed megatron-core, if any")


def parse_gpu(text: str) -> tuple[str | None, str]:
    """'H100', 'NVIDIA H100 80GB HBM3', '9.0', 'sm_90' -> (name or None, compute capability)."""
    raw = text.strip()
    m = re.fullmatch(r"(?:sm_?|compute_?)?(\d{1,2})\.?(\d)", raw, flags=re.IGNORECASE)
    if m:
        return None, f"{int(m.group(1))}.{m.group(2)}"
    words = re.split(r"[\s\-_/]+", raw.upper())
    for word in words:
        if word in GPU_CAPABILITY:
            return raw, GPU_CAPABILITY[word]
    raise ConfigError(f"gpu {text[:60]!r}: unknown GPU name; give a known name or a compute capability",
                      field="gpu", fix="e.g. --gpu H100 or --gpu 9.0",
                      choices=sorted(GPU_CAPABILITY))


@lru_cache(maxsize=1)
def _nvidia_smi() -> tuple[str, str] | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0 or not out.stdout.strip():
        return None
    name, _, cap = out.stdout.strip().splitlines()[0].rpartition(",")
    return (name.strip(), cap.strip()) if name and parse_version(cap.strip()) else None


def _te_installed() -> str | None:
    # The TE wheel has been published under several names.
    for dist in ("transformer-engine", "transformer_engine", "transformer-engine-cu12", "transformer-engine-torch"):
        if (v := installed_version(dist)) is not None:
            return v
    return None


def detect_environment(*, torch_version: str | None = None, te_version: str | None = None,
                       gpu: str | None = None, env: Mapping[str, str] | None = None,
                       detect: bool = True) -> Environment:
    """Given values win; the rest is detected when `detect`, else left unknown."""
    for name, value in (("torch_version", torch_version), ("te_version", te_version)):
        if value is not None and not is_version_number(value):
            raise ConfigError(f"{name} {value[:40]!r} is not a version number", field=name, fix="e.g. 2.6.0")
    out = Environment()
    if torch_version is not None:
        out.torch_version, out.torch_version_source = torch_version, "given"
    elif detect and (v := installed_version("torch")) is not None:
        out.torch_version, out.torch_version_source = v, "detected"
    if te_version is not None:
        out.te_version, out.te_version_source = te_version, "given"
    elif detect and (v := _te_installed()) is not None:
        out.te_version, out.te_version_source = v, "detected"
    if gpu is not None:
        out.gpu_name, out.compute_capability = parse_gpu(gpu)
        out.gpu_source = "given"
    elif detect and (found := _nvidia_smi()) is not None:
        out.gpu_name, out.compute_capability = found
        out.gpu_source = "detected"
    source_env = os.environ if env is None else env
    out.cuda_device_max_connections = source_env.get("CUDA_DEVICE_MAX_CONNECTIONS")
    out.megatron_core_version = installed_version("megatron-core") if detect else None
    return out
