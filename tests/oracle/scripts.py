"""Real Megatron-LM command lines for the argv oracle: the flag sets of Megatron-LM's own launch scripts and MoE
README (tests/data/megatron_lm/*.args, each naming its source file and commit), as they are and with the README's
EP-overlap flags added, plus the VPP forms the issue is about on the README's Mixtral model.
"""

from __future__ import annotations

import shlex
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data" / "megatron_lm"
OVERLAP = ["--overlap-moe-expert-parallel-comm"]
README_SET = ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]  # MoE README, "EP A2A overlap"
# World sizes the scripts' parallel layout divides (the scripts take it from the launcher).
# Which releases a fixture is checked with: a script of a later tag may use flags an older release lacks.
FROM_RELEASE = {"mfsdp-deepseek-v3-core_v0.19.0": "0.19.2"}
WORLD = {"moe-readme-mixtral-core_v0.19.0": 64, "mixtral-8x7b-core_v0.16.1": 64, "mfsdp-deepseek-v3-core_v0.19.0": 64}


def read(path: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of a fixture: '# env: K=V' header lines, then flag lines."""
    argv: list[str] = []
    env: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.startswith("# env: "):
            key, _, value = line[len("# env: "):].partition("=")
            env[key] = value
        elif line.strip() and not line.startswith("#"):
            argv += shlex.split(line)
    return argv, env


def _replace(argv: list[str], flag: str, new: list[str]) -> list[str]:
    i = argv.index(flag)
    return argv[:i] + new + argv[i + 2:]


def variants(name: str, argv: list[str]) -> dict[str, list[str]]:
    out = {"as is": argv, "+ overlap": argv + OVERLAP, "+ overlap, delayed wgrad": argv + README_SET}
    if "--num-layers-per-virtual-pipeline-stage" in argv:  # 32 layers, PP 4: 8 per stage is VPP 1
        vpp = "--num-layers-per-virtual-pipeline-stage"
        out |= {
            "+ overlap, 4 layers per virtual stage": _replace(argv, vpp, [vpp, "4"]) + OVERLAP,
            "+ overlap, 2 virtual stages per rank": _replace(argv, vpp, ["--num-virtual-stages-per-pipeline-rank",
                                                                         "2"]) + OVERLAP,
            "+ overlap, layout of 8 stages": _replace(argv, vpp, ["--pipeline-model-parallel-layout",
                                                                  "Etttt|(tttt|)*6ttttL"]) + OVERLAP,
            "+ overlap, layout of 4 stages": _replace(argv, vpp, ["--pipeline-model-parallel-layout",
                                                                  "Et*8|t*8|t*8|t*8L"]) + OVERLAP,
            # Core 0.16 does not check moe recompute under the overlap (Bridge does; 0.17 Core does)
            "+ overlap, 4 per stage, moe recompute": _replace(argv, vpp, [vpp, "4"]) + OVERLAP + [
                "--recompute-granularity", "selective", "--recompute-modules", "moe"],
            # fusion is on by default: attention CUDA graphs with delayed wgrad need nothing more (TE 2.12)
            "+ overlap, delayed wgrad, 4 per stage, attn graphs": _replace(argv, vpp, [vpp, "4"]) + README_SET + [
                "--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn",
                "--moe-pad-experts-for-cuda-graph-inference"],
        }
    return out


def cases(version: str) -> list[tuple[str, str, list[str], dict[str, str]]]:
    """(fixture, variant, argv, environment) for every fixture checked with `version` and each of its variants."""
    out = []
    for path in sorted(DATA.glob("*.args")):
        first = FROM_RELEASE.get(path.stem, "0.0.0")
        if tuple(map(int, version.split("."))) < tuple(map(int, first.split("."))):
            continue
        argv, env = read(path)
        env = {"WORLD_SIZE": str(WORLD[path.stem]), "RANK": "0", **env}
        for label, words in variants(path.stem, argv).items():
            out.append((path.stem, label, words, env))
    return out
