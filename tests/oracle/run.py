"""The differential oracle: generated configs, Core's verdict (one child process per release), ours, compared.

Only the rules a release's TransformerConfig enforces can be compared with TransformerConfig; the others
(Megatron-Bridge's checks, asserts Core raises later, Megatron-LM's argument checks, advice) are intentional
differences, listed in INTENTIONAL with the reason.

The Bridge oracle (run_bridge_oracle) does the same for Bridge-style configs with Megatron-Bridge 0.6.2's own code
on top of the Core release it pins (bridge_cases.py, bridge_driver.py): there the Core and Bridge rules are compared,
and our apply_flex_dispatcher_backend against Bridge's. `python -m tests.oracle.run` prints the table.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from moe_overlap.skill.rules import sources
from moe_overlap.skill.rules.validate import validate_config
from tests.oracle import bridge_cases, releases
from tests.oracle.generate import core_kwargs, generate, near_valid

N_CONFIGS = 600
SEED = 20261129
DRIVER = Path(__file__).with_name("core_driver.py")

# Error rules that are not TransformerConfig checks, and why the validator still reports them.
INTENTIONAL = {
    "num-experts-gt-1": "Megatron-Bridge asserts num_moe_experts > 1 (comm_overlap.py); Core accepts one expert",
    "no-moe-recompute-module": "Core checks it from 0.17; Megatron-Bridge 0.6.2 checks it for 0.16 too",
    "wgrad-overlap-grad-reduce-te-2-7": "Megatron-Bridge's check; overlap_grad_reduce is a DDP setting Core never sees",
    "wgrad-grad-accum-fusion-te-2-7": "Megatron-Bridge's check of TE >= 2.7 with gradient_accumulation_fusion on",
    "wgrad-cuda-graph-te-2-12": "Megatron-Bridge's check (and Megatron-LM's with overlap_grad_reduce)",
    "flex-backend-gpu-support": "Megatron-Bridge checks the GPU; TransformerConfig never looks at it",
    "cuda-graph-whole-layer": "asserted at the first step (transformer_layer.py), after TransformerConfig accepted it",
    "fsdp-no-double-buffer": "asserted when Megatron-FSDP wraps the model (mcore_fsdp_adapter.py), a DDP setting",
    "fsdp-no-per-layer-cuda-graphs": "asserted when Megatron-FSDP wraps the model (mcore_fsdp_adapter.py)",
    "wgrad-overlap-grad-reduce-te-2-8": "Megatron-LM's argument check (megatron/training/arguments.py)",
    "wgrad-no-grad-accum-fusion-te-2-7": "Megatron-LM's argument check (megatron/training/arguments.py)",
    "wgrad-needs-te-layers": "Megatron-LM's argument check; local layers have no delayed-wgrad path",
    "wgrad-te-min-2-3": "raised when the Transformer Engine layers are built (extensions/transformer_engine.py)",
    "ncclep-needs-core-0-19": "raised when the flex dispatcher is built ('Invalid backend', token_dispatcher.py)",
}


@dataclass
class Report:
    version: str
    configs: int = 0
    accepted: int = 0
    rejected: int = 0
    disagreements: list = field(default_factory=list)
    unrelated: list = field(default_factory=list)  # Core rejections with a message no known check has
    intentional: dict = field(default_factory=dict)  # rule -> configs Core accepts that the rule rejects
    sole_reason: set = field(default_factory=set)  # core rules that alone decided a rejection at least once
    core_rules: set = field(default_factory=set)
    error_rules: set = field(default_factory=set)
    seconds_core: float = 0.0
    seconds_ours: float = 0.0
    core_file: str = ""


def _cases(version: str, n: int) -> list[tuple[dict, dict]]:
    rng = random.Random(SEED + sum(releases.line(version)))
    line = releases.line(version)
    return [generate(rng, line) if i % 2 else near_valid(rng, line) for i in range(n)]


def core_verdicts(version: str, cases: list[tuple[dict, dict]]) -> dict:
    line = releases.line(version)
    payload = [{"kwargs": core_kwargs(c, line), "torch": e["torch_version"], "te": e["te_version"]} for c, e in cases]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["PYTHONPATH"] = releases.python_path(version)
    proc = subprocess.run([sys.executable, str(DRIVER)], input=json.dumps(payload), capture_output=True, text=True,
                          env=env, timeout=600, cwd=str(DRIVER.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"megatron-core {version} driver failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _known_messages(version: str) -> list[str]:
    # The table's substrings are read from source lines; quotes around a name belong to the literal.
    return [sub.strip("'") for path, sub, lines in sources.CORE.values() if path == sources.TC and version in lines]


@cache
def run_oracle(version: str, n: int = N_CONFIGS) -> Report:
    report = Report(version=version)
    cases = _cases(version, n)
    start = time.perf_counter()
    core = core_verdicts(version, cases)
    report.seconds_core = time.perf_counter() - start
    report.core_file = core["file"]
    known = _known_messages(version)
    start = time.perf_counter()
    for i, ((config, env), (core_ok, exc, message)) in enumerate(zip(cases, core["results"], strict=True)):
        result = validate_config(config, megatron_core_version=version, detect=False, env={}, **env)
        core_rules = set(result.rule_set.core_rules)
        report.core_rules = core_rules
        errors = {f.rule for f in result.findings if f.severity == "error"}
        report.error_rules |= {r for r in result.rule_set.runtime_rules + result.rule_set.bridge_rules}
        ours_core = errors & core_rules
        report.configs += 1
        if not core_ok and not any(m in message for m in known):
            report.unrelated.append((i, exc, message[:300], config, env))
            continue
        report.accepted += core_ok
        report.rejected += not core_ok
        if core_ok == bool(ours_core):
            report.disagreements.append((i, core_ok, message[:300], sorted(ours_core), config, env))
        if core_ok:
            for rule in errors - core_rules:
                report.intentional[rule] = report.intentional.get(rule, 0) + 1
        elif len(ours_core) == 1:
            report.sole_reason |= ours_core
    report.seconds_ours = time.perf_counter() - start
    return report


# Bridge's own checks run only when comm_overlap sets the flag (comm_overlap.py:478, :520); with the flag set on
# the model they are skipped, while the validator still reports them (the condition is the same).
BRIDGE_ONLY_VIA_COMM = {"num-experts-gt-1": "overlap_moe_expert_parallel_comm",
                        "wgrad-overlap-grad-reduce-te-2-7": "delay_wgrad_compute",
                        "wgrad-grad-accum-fusion-te-2-7": "delay_wgrad_compute",
                        "wgrad-cuda-graph-te-2-12": "delay_wgrad_compute"}
BRIDGE_N = 500
BRIDGE_DRIVER = DRIVER.with_name("bridge_driver.py")


@dataclass
class BridgeReport:
    cases: int = 0
    accepted: int = 0
    rejected: int = 0
    by_stage: dict = field(default_factory=dict)  # Bridge's stage that rejected -> configs
    disagreements: list = field(default_factory=list)
    apply_disagreements: list = field(default_factory=list)  # our apply_flex_dispatcher_backend vs Bridge's
    applied: int = 0
    unrelated: list = field(default_factory=list)
    intentional: dict = field(default_factory=dict)  # rule -> configs Bridge accepts that the rule rejects
    sole_reason: set = field(default_factory=set)
    compared_rules: set = field(default_factory=set)
    seconds_bridge: float = 0.0
    seconds_ours: float = 0.0
    files: tuple = ()


def bridge_verdicts(cases: list[dict]) -> dict:
    from tests.oracle.fetch import bridge_dir

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = releases.python_path(bridge_cases.CORE_RELEASE)
    proc = subprocess.run([sys.executable, str(BRIDGE_DRIVER), str(bridge_dir())],
                          input=json.dumps([bridge_cases.driver_case(c) for c in cases]), capture_output=True,
                          text=True, env=env, timeout=600, cwd=str(DRIVER.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"megatron-bridge driver failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def _ours_bridge(case: dict) -> tuple[set[str], set[str], list]:
    """Our verdict on a Bridge config: (errors of Core + Bridge rules, other errors, dispatcher after apply)."""
    from moe_overlap.skill.rules.flex_backend import apply_flex_dispatcher_backend

    config, env = case["config"], case["env"]
    if case["apply_backend"]:
        gpu = None if case["apply_without_gpu"] else case["gpu"]
        config, _ = apply_flex_dispatcher_backend(config, case["apply_backend"], gpu=gpu)
    model = config["model"]
    applied = [model.get("moe_token_dispatcher_type", "allgather"), model.get("moe_flex_dispatcher_backend", "deepep"),
               bool(model.get("moe_shared_expert_overlap"))]
    result = validate_config(config, megatron_core_version=bridge_cases.CORE_RELEASE, detect=False, env={}, **env)
    # A rule Bridge enforces is compared even in a release where it is listed under runtime_rules (Megatron-LM
    # checks it too, e.g. wgrad-cuda-graph-te-2-12 from 0.17): the kind names the first enforcer, not the only one
    compared = set(result.rule_set.core_rules) | set(result.rule_set.bridge_rules) | _bridge_enforced()
    errors = {f.rule for f in result.findings if f.severity == "error"}
    return errors & compared, errors - compared, applied


@cache
def _bridge_enforced() -> frozenset[str]:
    from moe_overlap.skill.rules.registry import all_rules

    return frozenset(r.id for r in all_rules() if r.bridge)


@cache
def run_bridge_oracle(n: int = BRIDGE_N) -> BridgeReport:
    report = BridgeReport()
    cases = bridge_cases.cases(n, SEED + 62)
    start = time.perf_counter()
    bridge = bridge_verdicts(cases)
    report.seconds_bridge = time.perf_counter() - start
    report.files = (bridge["core_file"], bridge["bridge_file"])
    known = _known_messages(bridge_cases.CORE_RELEASE)
    start = time.perf_counter()
    for i, (case, (ok, stage, exc, message, applied)) in enumerate(zip(cases, bridge["results"], strict=True)):
        ours, others, our_applied = _ours_bridge(case)
        report.cases += 1
        if case["apply_backend"]:
            report.applied += 1
            if [applied[0], applied[1] or "deepep", applied[2]] != [our_applied[0], our_applied[1] or "deepep",
                                                                    our_applied[2]]:
                report.apply_disagreements.append((i, applied, our_applied, case))
        # Bridge's comm-overlap checks are asserts (comm_overlap.py:478-557), its GPU check raises ValueError
        # (flex_dispatcher_backend.py:102-126); Core's rejections must carry a known check's message.
        bridge_check = (stage, exc) in (("comm", "AssertionError"), ("flex", "ValueError"))
        if not ok and not (bridge_check or (stage == "core" and any(m in message for m in known))):
            report.unrelated.append((i, stage, exc, message[:300], case))
            continue
        report.accepted += ok
        report.rejected += not ok
        if not ok:
            report.by_stage[stage] = report.by_stage.get(stage, 0) + 1
        report.compared_rules |= ours
        comm = case["config"].get("comm_overlap") or {}
        skipped = {r for r in ours if r in BRIDGE_ONLY_VIA_COMM and comm.get(BRIDGE_ONLY_VIA_COMM[r]) is not True}
        if ok and ours and ours <= skipped:
            for rule in ours:
                report.intentional[rule] = report.intentional.get(rule, 0) + 1
        elif ok == bool(ours):
            report.disagreements.append((i, ok, stage, message[:300], sorted(ours), case))
        if ok:
            for rule in others:
                report.intentional[rule] = report.intentional.get(rule, 0) + 1
        elif len(ours) == 1:
            report.sole_reason |= ours
    report.seconds_ours = time.perf_counter() - start
    return report


def available() -> list[str]:
    return [v for v in releases.RELEASES if releases.is_unpacked(v)]


def main() -> None:
    """The Core table, then the Megatron-LM argv table (tests/oracle/mlm.py)."""
    from tests.oracle import mlm

    _core_table()
    print()
    mlm.main([])


def _core_table() -> None:
    print("| release | configs | Core accepts | Core rejects | disagreements | unrelated rejections | "
          "intentional differences (configs) | Core s | ours s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for version in available():
        r = run_oracle(version)
        diffs = ", ".join(f"{k} {v}" for k, v in sorted(r.intentional.items()))
        print(f"| {version} | {r.configs} | {r.accepted} | {r.rejected} | {len(r.disagreements)} | "
              f"{len(r.unrelated)} | {diffs} | {r.seconds_core:.1f} | {r.seconds_ours:.1f} |")
    if releases.is_unpacked(bridge_cases.CORE_RELEASE):
        b = run_bridge_oracle()
        diffs = ", ".join(f"{k} {v}" for k, v in sorted(b.intentional.items()))
        print(f"| bridge 0.6.2 on {bridge_cases.CORE_RELEASE} | {b.cases} | {b.accepted} | {b.rejected} | "
              f"{len(b.disagreements)} (apply: {len(b.apply_disagreements)} of {b.applied}) | {len(b.unrelated)} | "
              f"{diffs} | {b.seconds_bridge:.1f} | {b.seconds_ours:.1f} |")


if __name__ == "__main__":
    main()
