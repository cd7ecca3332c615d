"""The Megatron-LM argv oracle: generated command lines, Megatron-LM's verdict (one child process per release, its
own ``parse_args -> validate_args -> core_transformer_config_from_args``), ours (``validate --argv``), compared.

Megatron-LM raises at its first failed check; the validator reports every rule that fails. So a rejection must
be matched by an error of ours, and the rule its message belongs to (MESSAGES) must be among them; an acceptance
must get no error from the rules the argument handling enforces. Rules that fire later (at model build, at the
first step) or that Megatron-LM never checks are listed in ADVISORY with the reason; they are not compared.

For 0.16.1, whose wheel and sdist lack megatron/training, the verdicts of its core_v0.16.1 tag are recorded in
tests/data/oracle/ (``python -m tests.oracle.mlm --record``, with the tag unpacked by ``python -m
tests.oracle.fetch --megatron-lm-git DIR``); CI replays them, a checkout with the tag runs it live.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from moe_overlap.skill.config.argv import FLAGS
from moe_overlap.skill.rules import sources
from moe_overlap.skill.rules.validate import validate_config
from tests.oracle import releases, scripts
from tests.oracle.generate_argv import generate

N_ARGV = 400
SEED = 20261201
DRIVER = Path(__file__).with_name("mlm_driver.py")
RECORDED = Path(__file__).resolve().parents[1] / "data" / "oracle"

# Error rules the argument handling does not enforce, and why the validator still reports them for Megatron-LM.
ADVISORY = {
    "cuda-graph-whole-layer": "asserted at the first step (transformer_layer.py), after the arguments were accepted",
    "wgrad-te-min-2-3": "raised when the Transformer Engine layers are built (extensions/transformer_engine.py)",
    "ncclep-needs-core-0-19": "raised when the flex dispatcher is built ('Invalid backend', token_dispatcher.py)",
    "fsdp-no-double-buffer": "asserted when Megatron-FSDP wraps the model (mcore_fsdp_adapter.py)",
    "fsdp-no-per-layer-cuda-graphs": "asserted when Megatron-FSDP wraps the model (mcore_fsdp_adapter.py)",
}

# sources.CORE check -> the rule whose failure that message reports.
_CHECK_RULE = {
    "torch": "torch-min-2-6", "vpp": "pp-requires-vpp", "ep": "ep-size-gt-1", "dispatcher": "dispatcher-alltoall-or-flex",
    "full-recompute": "no-full-recompute", "recompute-method": "no-recompute-method",
    "recompute-layers": "no-recompute-num-layers", "moe-recompute": "no-moe-recompute-module",
    "precision": "precision-bf16-or-fp16", "shared-overlap": "no-shared-expert-overlap", "mtp-1": "mtp-layers-limit",
    "mtp-0-1": "mtp-layers-limit", "mtp-pp": "mtp-requires-pp", "graph-scope": "cuda-graph-scope-excludes-moe",
    "ncclep-offload": "ncclep-no-fc1-offload", "wgrad-overlap": "wgrad-requires-overlap",
    "wgrad-legacy-gemm": "wgrad-no-legacy-grouped-gemm", "wgrad-graph-te": "wgrad-cuda-graph-te-2-10",
    "dispatch-wgrad-overlap": "dispatch-wgrad-excludes-ep-overlap", "dispatch-wgrad-te": "dispatch-wgrad-te-2-3",
    "dispatch-wgrad-delay": "dispatch-wgrad-excludes-delayed-wgrad", "early-release": "early-attn-release-needs-overlap",
    "deepep-flex": "deepep-flag-needs-flex", "deepep-hybridep": "deepep-flag-excludes-hybridep",
    "ncclep-flex": "ncclep-needs-flex", "mlm-grad-reduce-te": "wgrad-overlap-grad-reduce-te-2-8",
    "mlm-graph-te": "wgrad-cuda-graph-te-2-12", "mlm-te-impl": "wgrad-needs-te-layers",
    "mlm-no-fusion-te": "wgrad-no-grad-accum-fusion-te-2-7",
}
# Megatron-LM messages of the same checks that sources.CORE does not list (one table row per check there).
_MORE = {
    "CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion": "wgrad-cuda-graph-te-2-12",
    "CUDA graph with delay_wgrad_compute doesn't support attn bias": "wgrad-cuda-graph-te-2-12",
    "number of layers per pipeline stage must be divisible": "config:layer-split",
    "number of layers of the model must be divisible pipeline": "config:layer-split",
    "Number of layers should be divisible by the pipeline-model-parallel size": "config:layer-split",
    "The length of pipeline_model_parallel_layout must be divisible": "config:layer-split",
    "When interleaved schedule is used": "config:layer-split",
    "please use --num-virtual-stages-per-pipeline-rank to specify virtual pipeline": "config:layer-split",
    "No more than one of the following arguments can be set": "config:layer-split",
}


def messages() -> dict[str, str]:
    """Substring of a rejection message -> the rule it reports."""
    out = {sub.strip("'"): _CHECK_RULE[check] for check, (_, sub, _) in sources.CORE.items() if check in _CHECK_RULE}
    return out | _MORE


@dataclass
class Report:
    version: str
    argv: int = 0
    accepted: int = 0
    rejected: int = 0
    live: bool = True
    disagreements: list = field(default_factory=list)
    unrelated: list = field(default_factory=list)  # rejections with a message no rule knows
    advisory: dict = field(default_factory=dict)  # rule -> accepted argv the rule rejects
    rules_seen: set = field(default_factory=set)  # rules that decided a Megatron-LM rejection
    seconds_mlm: float = 0.0
    seconds_ours: float = 0.0
    mlm_file: str = ""


def cases(version: str, n: int = N_ARGV) -> list:
    rng = random.Random(SEED + sum(releases.line(version)))
    return [generate(rng, releases.line(version), near_valid=bool(i % 2)) for i in range(n)]


def _payload(items: list) -> list[dict]:
    return [{"argv": c.argv(), "env": c.environment(), "te": c.te, "torch": c.torch} for c in items]


def digest(payload: list[dict]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def recording(version: str) -> Path:
    return RECORDED / f"megatron-lm-{version}-verdicts.json"


def _live(version: str, payload: list[dict]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = releases.mlm_python_path(version)
    proc = subprocess.run([sys.executable, str(DRIVER), str(releases.mlm_training_root(version))],
                          input=json.dumps(payload), capture_output=True, text=True, env=env, timeout=600,
                          cwd=str(DRIVER.parent))
    if proc.returncode != 0:
        raise RuntimeError(f"Megatron-LM {version} driver failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


@cache
def mlm_verdicts(version: str) -> dict:
    """The release's own verdicts on the generated command lines ("results") and on the real ones ("scripts"),
    from one child process when its megatron/training is here, else from the committed recording."""
    generated, real = _payload(cases(version)), script_payload(version)
    start = time.perf_counter()
    if releases.has_mlm_training(version):
        out = _live(version, generated + real)
        return {"file": out["file"], "flags": out["flags"], "results": out["results"][:len(generated)],
                "scripts": out["results"][len(generated):], "live": True, "seconds": time.perf_counter() - start}
    data = json.loads(recording(version).read_text())
    for key, payload in (("results", generated), ("scripts", real)):
        if data[f"{key}_digest"] != digest(payload):
            raise RuntimeError(f"{recording(version)} was recorded for other command lines (a generator or a "
                               "fixture changed): re-record with `python -m tests.oracle.mlm --record` where the "
                               "tag is unpacked")
    return {key: data[key] for key in ("file", "flags", "results", "scripts")} | {
        "live": False, "seconds": time.perf_counter() - start}


def parser_flags(version: str) -> frozenset[str]:
    """The option strings of the release's own Megatron-LM parser (from its run, else recorded for 0.16.1)."""
    return frozenset(mlm_verdicts(version)["flags"])


def available() -> list[str]:
    return [v for v in releases.RELEASES if releases.has_mlm_training(v) or recording(v).is_file()]


def ours(case, version: str):
    return validate_config(argv=case.argv(), megatron_core_version=version, detect=False, env=case.environment(),
                           torch_version=case.torch, te_version=case.te, gpu="H100")


@cache
def run_oracle(version: str) -> Report:
    report = Report(version=version)
    items, mlm = cases(version), mlm_verdicts(version)
    report.seconds_mlm, report.live, report.mlm_file = mlm["seconds"], mlm["live"], mlm["file"]
    known = messages()
    start = time.perf_counter()
    for i, (case, (ok, exc, message, _derived)) in enumerate(zip(items, mlm["results"], strict=True)):
        result = ours(case, version)
        errors = {f.rule for f in result.findings if f.severity == "error"}
        compared = errors - set(ADVISORY)
        report.argv += 1
        rule = next((r for sub, r in known.items() if sub in message), None)
        if not ok and rule is None:
            report.unrelated.append((i, exc, message[:300], case.argv(), case.environment()))
            continue
        report.accepted += ok
        report.rejected += not ok
        if ok and compared or not ok and rule not in errors:
            report.disagreements.append((i, ok, message[:300], sorted(errors), case.argv(), case.environment(),
                                         case.te, case.torch))
        if ok:
            for r in errors & set(ADVISORY):
                report.advisory[r] = report.advisory.get(r, 0) + 1
        else:
            report.rules_seen.add(rule)
    report.seconds_ours = time.perf_counter() - start
    return report


def script_payload(version: str) -> list[dict]:
    return [{"argv": argv, "env": env, "te": "2.12.0", "torch": "2.6.0"} for _, _, argv, env in scripts.cases(version)]


def record(version: str) -> Path:
    payload, real = _payload(cases(version)), script_payload(version)
    if not releases.has_mlm_training(version):
        raise SystemExit(f"Megatron-LM {version}'s megatron/training is not unpacked: python -m tests.oracle.fetch "
                         "--megatron-lm-git DIR")
    out = mlm_verdicts(version)
    source = (releases.mlm_training_root(version) / "SOURCE").read_text().strip()
    data = {"source": source, "generated_by": "python -m tests.oracle.mlm --record",
            "file": str(Path(out["file"]).relative_to(releases.cache_dir())),
            "results_digest": digest(payload), "scripts_digest": digest(real),
            "scripts": out["scripts"],
            "flags": sorted(f for f in out["flags"] if f in FLAGS), "results": out["results"]}
    RECORDED.mkdir(parents=True, exist_ok=True)
    recording(version).write_text(json.dumps(data, separators=(",", ":")) + "\n")
    return recording(version)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", action="store_true", help="record the verdicts of releases.MLM_TAGS")
    args = parser.parse_args(argv)
    if args.record:
        for version in releases.MLM_TAGS:
            print(f"recorded {record(version)}")
        return
    print("| release | argv | Megatron-LM accepts | rejects | disagreements | unrelated | advisory (argv) | "
          "verdicts | Megatron-LM s | ours s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for version in available():
        r = run_oracle(version)
        adv = ", ".join(f"{k} {v}" for k, v in sorted(r.advisory.items()))
        print(f"| {version} | {r.argv} | {r.accepted} | {r.rejected} | {len(r.disagreements)} | {len(r.unrelated)} | "
              f"{adv} | {'live' if r.live else 'recorded'} | {r.seconds_mlm:.1f} | {r.seconds_ours:.1f} |")


if __name__ == "__main__":
    main()
