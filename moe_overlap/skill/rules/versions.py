"""Version strings and the Megatron-Core release lines the rule set knows.

The EP-overlap checks in ``TransformerConfig.__post_init__`` changed between releases (MTP limits,
``moe`` recompute, the ncclep rules, the CUDA-graph field name), so each rule carries the release range
it holds for and the validator picks the rule set of one release line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata

# Release lines whose TransformerConfig checks the rules describe, oldest first.
KNOWN_CORE_RELEASES: tuple[tuple[int, int], ...] = ((0, 16), (0, 17), (0, 18), (0, 19))
OLDEST, NEWEST = KNOWN_CORE_RELEASES[0], KNOWN_CORE_RELEASES[-1]

# At most 9 digits a part: a 5000-digit "version" is not one (and int() of it would raise).
_VERSION = re.compile(r"^\s*v?(\d{1,9})(?!\d)(?:\.(\d{1,9})(?!\d))?(?:\.(\d{1,9})(?!\d))?"
                      r"(?:[.\-_]?(a|b|rc|dev|alpha|beta|pre)\.?\d{0,9})?")


def parse_version(text: str | None) -> tuple[int, int, int, int] | None:
    """'2.6.0' -> (2, 6, 0, 0); a pre-release ('2.6.0a0', '2.7.0.dev0') sorts just below its release
    (as packaging does, so 2.6.0a0 does not satisfy >= 2.6.0); '+cpu' style local tags are ignored."""
    if text is None:
        return None
    m = _VERSION.match(str(text))
    if not m:
        return None
    major, minor, patch = (int(g) if g else 0 for g in m.group(1, 2, 3))
    return (major, minor, patch, -1 if m.group(4) else 0)


def is_version_number(text: str) -> bool:
    """A version a user typed: the whole string must read as one ('2.6.0', '2.7.0rc1', '2.6.0+cu124'),
    so that '2.x' or '2.6-ish' are refused rather than read as 2.0 or 2.6 (parse_version alone is lenient,
    for versions found in package metadata)."""
    m = _VERSION.match(str(text))
    rest = str(text)[m.end():].strip() if m else None
    return m is not None and (rest == "" or rest.startswith("+") or re.fullmatch(r"\.?post\d*", rest) is not None)


def at_least(version: str | None, minimum: str) -> bool | None:
    """True/False, or None when `version` is unknown or unreadable (the caller must say so, never pass)."""
    have, need = parse_version(version), parse_version(minimum)
    if have is None or need is None:
        return None
    return have >= need


@cache
def installed_version(dist: str) -> str | None:
    """The installed version of a distribution, read from its metadata (never imports the package)."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class CoreSelection:
    """Which Megatron-Core release line's rules apply, and why (`reason`, always set: the release is never
    silent). `note` is set when the result must say more than the reason (the newest known release used for
    want of any other, or a release outside the known range: then `warning`)."""

    line: tuple[int, int]
    requested: str | None
    source: str  # "given" | "implied" | "default"
    note: str | None = None
    warning: bool = False
    reason: str = ""

    @property
    def name(self) -> str:
        return f"megatron-core {self.line[0]}.{self.line[1]}"


def _known() -> str:
    from moe_overlap.skill.rules.sources import RELEASES

    return ", ".join(RELEASES)


def select_core(requested: str | None = None, implied: tuple[str, str] | None = None) -> CoreSelection:
    """The rule set for `requested` (--megatron-core-version), else the release `implied` by the config
    ((version, why): a Megatron-Bridge config runs on its Bridge's Core), else the newest known release, with a
    note saying so. The megatron-core installed beside this package is not taken as the user's: pip picks it for
    moe-overlap (0.16.1 on Python 3.11, whatever the training cluster runs), so the note only names it."""
    if requested is not None:
        source, reason = "given", f"given: --megatron-core-version {requested[:40]}"
    elif implied is not None:
        requested, why = implied
        source, reason = "implied", f"implied: {why}"
    else:
        installed = installed_version("megatron-core")
        here = (f"megatron-core {installed} is installed here, which need not be the release you train with: "
                f"give --megatron-core-version {installed} if it is" if installed else "megatron-core is not installed")
        return CoreSelection(NEWEST, None, "default", (
            f"no --megatron-core-version was given and none is implied by the config: the rules of the newest known "
            f"release line, {NEWEST[0]}.{NEWEST[1]}, were applied (known: {_known()}); {here}"),
            reason="newest known release used, none given or implied")
    parsed = parse_version(requested)
    if parsed is None or (source == "given" and not is_version_number(requested)):
        from moe_overlap.skill.config.load import ConfigError

        raise ConfigError(f"megatron-core version {requested[:40]!r} is not a version number",
                          field="megatron_core_version", fix="e.g. --megatron-core-version 0.16.1")
    line = parsed[:2]
    if line < OLDEST or line > NEWEST:
        nearest = OLDEST if line < OLDEST else NEWEST
        which = "older than the oldest" if line < OLDEST else "newer than the newest"
        return CoreSelection(nearest, requested, source, (
            f"megatron-core {requested} is {which} release whose checks are known ({_known()}): the rules of "
            f"{nearest[0]}.{nearest[1]}, the nearest known release, were applied and may differ from {requested}'s "
            "own checks"), warning=True, reason=reason)
    return CoreSelection(line, requested, source, reason=reason)
