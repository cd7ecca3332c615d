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


# Megatron-LM's argument handling (megatron/training) ships in the megatron-core wheels from 0.17; neither the
# 0.16.1 wheel nor its PyPI sdist has it (checked 2026-12-01), so 0.16.1's comes from the core_v0.16.1 tag of a
# Megatron-LM git checkout (`python -m tests.oracle.fetch --megatron-lm-git DIR`), where one exists; CI has none
# and checks 0.16.1 against the verdicts recorded from it (tests/data/oracle/).
MLM_TAGS = {"0.16.1": "core_v0.16.1"}


def mlm_training_root(version: str) -> Path:
    """The folder holding megatron/training for `version` (the release itself from 0.17)."""
    return cache_dir() / f"megatron-lm-training-{version}" if version in MLM_TAGS else release_dir(version)


def has_mlm_training(version: str) -> bool:
    return is_unpacked(version) and (mlm_training_root(version) / "megatron" / "training" / "arguments.py").is_file()


def mlm_python_path(version: str) -> str:
    extra = [str(mlm_training_root(version))] if version in MLM_TAGS else []
    return os.pathsep.join([python_path(version), *extra])


def line(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)
