"""Where the data folders (skills/, schemas/, docs/) and the example configs are.

From a checkout they sit at the top of the repository, beside the package; in an installed wheel
they are packaged under ``moe_overlap/_data`` (pyproject's force-include). Both layouts are looked up
the same way, so callers never care which one they run from.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

_PKG = Path(__file__).resolve().parent


@lru_cache(maxsize=1)
def data_root() -> Path:
    """The folder holding skills/, schemas/ and docs/."""
    packaged = _PKG / "_data"
    if (packaged / "skills").is_dir():
        return packaged
    checkout = _PKG.parent
    if (checkout / "skills").is_dir():
        return checkout
    raise FileNotFoundError(
        f"moe-overlap data folders not found under {packaged} or {checkout}; reinstall the package"
    )


def skills_dir() -> Path:
    return data_root() / "skills"


def schemas_dir() -> Path:
    return data_root() / "schemas"


def docs_dir() -> Path:
    return data_root() / "docs"


def examples_dir() -> Path:
    """The example configs. They live in the skill folder (assets/), so the skill is complete when copied
    alone; a checkout's top-level examples/ is a link to it."""
    return skills_dir() / "perf-expert-parallel-overlap" / "assets"
