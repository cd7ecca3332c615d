"""A rule is data: id, severity, the keys it reads, a check, a message, a fix, a source and version bounds.

Rule ids are the card's constraint ids (skills/perf-expert-parallel-overlap/card.yaml); a test checks both
directions. This file holds the types every rule table imports; the tables live in overlap.py, wgrad.py
and flex.py, and registry.py collects them (so no table imports the file that imports it).

A check returns ``None`` (holds), a dict of values for the message (violated), or ``Unchecked(reason)``
when a fact it needs (a version, the GPU) is unknown: that becomes a warning, never a silent pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from moe_overlap.skill.rules.environment import Environment
from moe_overlap.skill.rules.versions import KNOWN_CORE_RELEASES, at_least

Severity = Literal["error", "warning", "info"]
# Who reads the config: Megatron-Bridge (a ConfigContainer: YAML, JSON, dict) or Megatron-LM (pretrain_gpt.py argv).
FLAVOURS = ("megatron-bridge", "megatron-lm")
Release = tuple[int, int]

ALL: tuple[Release, Release] = ((0, 0), (99, 99))


@dataclass(frozen=True)
class Unchecked:
    """The rule applies but cannot be decided: `reason` names the missing fact and how to give it."""

    reason: str


@dataclass(frozen=True)
class Ctx:
    """What a check sees: effective config values, where each came from, the environment, the rule set."""

    values: Mapping[str, Any]
    paths: Mapping[str, str]
    env: Environment
    core: Release
    flavour: str = "megatron-bridge"  # or "megatron-lm": which tool reads the config (FLAVOURS)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    @property
    def overlap(self) -> bool:
        return bool(self.values["overlap_moe_expert_parallel_comm"])

    @property
    def wgrad(self) -> bool:
        return bool(self.values["delay_wgrad_compute"])


Check = Callable[[Ctx], "dict[str, Any] | Unchecked | None"]


@dataclass(frozen=True)
class Rule:
    """One constraint. `holds` is the Megatron-Core release range the rule is part of the rule set for;
    `core` the range in which Core's own TransformerConfig enforces it (None: never);
    `runtime` the range in which Megatron-Core or Megatron-LM enforce it outside TransformerConfig (at model
    build, at the first step, or in Megatron-LM's argument checks); `bridge` whether Megatron-Bridge enforces
    it (it runs before Core, so it may be stricter); `mlm` that it is a check of Megatron-LM's arguments.py only
    (never run for a Bridge config). A rule none of them enforce is advice (a warning)."""

    id: str
    severity: Severity
    reads: tuple[str, ...]
    check: Check
    message: str  # str.format template over the config values and the check's dict
    fix: str
    source: str
    holds: tuple[Release, Release] = ALL
    core: tuple[Release, Release] | None = None
    bridge: bool = False
    runtime: tuple[Release, Release] | None = None
    mlm: bool = False
    extra_keys: tuple[str, ...] = field(default=())

    def applies_to(self, line: Release) -> bool:
        return self.holds[0] <= line <= self.holds[1]

    def core_checked(self, line: Release) -> bool:
        return self.core is not None and self.core[0] <= line <= self.core[1]

    def runtime_checked(self, line: Release) -> bool:
        return self.runtime is not None and self.runtime[0] <= line <= self.runtime[1]

    def kind(self, line: Release) -> str:
        """Who enforces it in this release: core (TransformerConfig), runtime, bridge, or advice."""
        if self.core_checked(line):
            return "core"
        if self.runtime_checked(line):
            return "runtime"
        return "bridge" if self.bridge else "advice"

    def for_flavour(self, flavour: str, line: Release) -> bool:
        """Whether the rule is part of the rule set for configs read by `flavour` in this release: Megatron-LM
        argv gets no Bridge-only error (Bridge never sees it), a Bridge config no Megatron-LM argument check."""
        if flavour == "megatron-lm":
            return not (self.severity == "error" and self.kind(line) == "bridge")
        return not self.mlm

    def releases(self) -> str:
        """The known release lines the rule holds for, e.g. '0.16-0.19' or '0.18-0.19' (the card's `releases`)."""
        lines = [f"{a}.{b}" for a, b in KNOWN_CORE_RELEASES if self.applies_to((a, b))]
        return lines[0] if len(lines) == 1 else f"{lines[0]}-{lines[-1]}"

    def path(self, ctx: Ctx) -> str:
        """The config path a user edits to fix it: the first key it reads."""
        return ctx.paths.get(self.reads[0], self.reads[0])


def needs_version(name: str, version: str | None, minimum: str, why: str) -> Unchecked | bool:
    """True when `version` >= `minimum`, False when below, Unchecked when unknown."""
    ok = at_least(version, minimum)
    if ok is None:
        flag = "--torch-version" if name == "torch" else "--te-version"
        return Unchecked(f"{name} version unknown, so '{why}' (needs {name} >= {minimum}) could not be checked; "
                         f"give {flag} V")
    return ok
