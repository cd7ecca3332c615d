"""Where the unpacked megatron-core releases live (`make oracle-releases` puts them there).

megatron-core >= 0.17 declares Python >= 3.12 but its config code runs on 3.11, so each release is unpacked with
`pip install --no-deps --ignore-requires-python --target DIR --python-version 3.12 --only-binary=:all:` into its
own folder; from 0.18 importing it also needs `triton` (a 3.11 wheel, unpacked beside them). The folders are a
cache: CI keeps them between runs under MOE_OVERLAP_MCORE_CACHE (default ~/.cache/moe-overlap/megatron-core).
"""

from __future__ import annotations

import os
from pathlib import Path

RELEASES = ("0.16.1", "0.17.1", "0.18.2", "0.19.2")
NEEDS_TRITON = ("0.18.2", "0.19.2")
REQUIRED_ENV = "MOE_OVERLAP_ORACLE_REQUIRED"  # set by `make test`: a missing release fails instead of skipping


def cache_dir() -> Path:
    env = os.environ.get("MOE_OVERLAP_MCORE_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "moe-overlap" / "megatron-core"


def release_dir(version: str) -> Path:
    return cache_dir() / version


def triton_dir() -> Path:
    return cache_dir() / "triton"


def is_unpacked(version: str) -> bool:
    ok = (release_dir(version) / "megatron" / "core" / "transformer" / "transformer_config.py").is_file()
    if version in NEEDS_TRITON:
        ok = ok and (triton_dir() / "triton" / "__init__.py").is_file()
    return ok


def python_path(version: str) -> str:
    parts = [str(release_dir(version))]
    if version in NEEDS_TRITON:
        parts.append(str(triton_dir()))
    return os.pathsep.join(parts)


def line(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)
