"""Random Megatron-LM command lines for the argv oracle: every overlap-related flag and the flags they interact with.

Each case is ``pretrain_gpt.py`` flags, the environment it runs in (WORLD_SIZE, CUDA_DEVICE_MAX_CONNECTIONS) and
the TE / torch versions the checks see. Half the cases draw each aspect independently (many violations at once);
half start from a command line Megatron-LM accepts and change one aspect, so each check is often the only reason
for a rejection. Only flags of the release at hand are used (the CUDA-graph scope is ``--cuda-graph-scope`` up
to 0.17, ``--cuda-graph-modules`` or the deprecated ``--cuda-graph-scope`` from 0.18). The world size is always
divisible (a tiny model, TP 1): a rejection for a reason no EP-overlap check has is a generator bug, and the
oracle reports it as such.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

Line = tuple[int, int]
ASPECTS = ("overlap", "experts", "dispatcher", "precision", "pipeline", "recompute", "graphs", "impl", "mtp",
           "fp8", "fusion", "shared", "grad_reduce", "bias", "connections", "early_release", "dispatch_wgrad",
           "versions")


@dataclass
class Case:
    line: Line
    flags: dict = field(default_factory=dict)  # aspect -> list of argv words
    env: dict = field(default_factory=dict)
    te: str = "2.12.0"
    torch: str = "2.6.0"
    pp: int = 1
    ep: int = 4
    layers: int = 16
    layout: tuple | None = None  # (stages, layers per stage, compact spelling): built in argv() (MTP adds "m")

    def argv(self) -> list[str]:
        words = ["--num-layers", str(self.layers), "--hidden-size", "64", "--ffn-hidden-size", "128",
                 "--num-attention-heads", "4", "--seq-length", "64", "--max-position-embeddings", "64",
                 "--position-embedding-type", "rope", "--no-rope-fusion", "--micro-batch-size", "1",
                 "--attention-dropout", "0", "--hidden-dropout", "0",
                 "--global-batch-size", str(self.ep * 2 * 2), "--moe-ffn-hidden-size", "32"]
        for aspect in ASPECTS:
            words += self.flags.get(aspect, [])
        if self.layout is not None:
            mtp = self.flags.get("mtp") or ["", "0"]
            words += ["--pipeline-model-parallel-layout", _layout(*self.layout, mtp=int(mtp[1]))]
        return words

    def environment(self) -> dict:
        return {"WORLD_SIZE": str(self.pp * self.ep * 2), "RANK": "0", **self.env}


def _layout(stages: int, per_stage: int, compact: bool, mtp: int = 0) -> str:
    """A --pipeline-model-parallel-layout string in one of Megatron-LM's spellings (explicit or with repeats);
    MTP layers go on the last stage, before the loss."""
    if not compact or stages < 3:
        parts = ["t" * per_stage] * stages
        parts[0] = "E" + parts[0]
        parts[-1] = parts[-1] + "m" * mtp + "L"
        return "|".join(parts)
    return f"E{'t' * per_stage}|(t*{per_stage}|)*{stages - 2}t*{per_stage},{'m' * mtp}L"


def _pipeline(rng: random.Random, case: Case, valid: bool) -> None:
    case.pp = rng.choice([1, 2, 4]) if not valid else rng.choice([1, 2, 4, 4])
    case.layers = rng.choice([8, 16, 32, 24]) if not valid else rng.choice([16, 32])
    per_rank = case.layers // case.pp
    forms = ["none", "per-stage", "stages", "layout"] if case.pp > 1 else ["none", "none", "stages", "layout"]
    form = rng.choice(forms[1:] if valid and case.pp > 1 else forms)
    words = ["--pipeline-model-parallel-size", str(case.pp)] if case.pp > 1 or rng.random() < 0.3 else []
    if form == "per-stage":
        divisors = [d for d in (1, 2, 4, 8, 16) if per_rank % d == 0 and (not valid or d < per_rank)]
        per_stage = rng.choice(divisors + ([3] if not valid else []))
        words += ["--num-layers-per-virtual-pipeline-stage", str(per_stage)]
    elif form == "stages":
        vpp = rng.choice([2, 2, 4] if valid else [1, 2, 4])
        words += ["--num-virtual-stages-per-pipeline-rank", str(vpp)]
    elif form == "layout":
        vpp = rng.choice([2, 2, 4] if valid else [1, 2, 4])
        while vpp > 1 and case.layers % (case.pp * vpp):
            vpp //= 2
        case.layout = (case.pp * vpp, case.layers // (case.pp * vpp), rng.random() < 0.5)
    case.flags["pipeline"] = words


def _graphs(rng: random.Random, case: Case, valid: bool) -> None:
    line = case.line
    impls = ["transformer_engine", "transformer_engine", "local"] if not valid else ["transformer_engine"]
    if line >= (0, 18) and not valid:
        impls.append("full_iteration")
    impl = rng.choice(impls)
    scopes = [["attn"], ["attn", "moe_router"], ["attn", "moe_router", "moe_preprocess"]]
    if not valid:
        scopes += [["moe"], ["attn", "moe"], [], ["full"]]
    scope = rng.choice(scopes)
    words = ["--cuda-graph-impl", impl]
    if impl == "full_iteration":  # Megatron-LM asks for this flag with full-iteration graphs
        scope = []
        words.append("--no-check-for-nan-in-loss-and-grad")
    if "moe" in scope:  # "moe" graphs need drop-and-pad (else Core refuses them for an unrelated reason)
        words += ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]
        case.flags["dispatcher"] = ["--moe-token-dispatcher-type", "alltoall"]
    if impl == "local" and rng.random() < 0.3:  # the old spelling of full-iteration graphs (0.18: migrated)
        scope = ["full_iteration"]
        words.append("--no-check-for-nan-in-loss-and-grad")
    if scope:
        name = "--cuda-graph-scope" if line < (0, 18) or rng.random() < 0.3 or scope == ["full_iteration"] else (
            "--cuda-graph-modules")
        if name == "--cuda-graph-modules" and scope == ["full"]:
            scope = ["attn"]
        words += [name, *scope]
    case.flags["graphs"] = words


def _recompute(rng: random.Random, case: Case) -> None:
    kind = rng.choice(["selective", "activations", "modules", "modules", "full"])
    words = {"selective": ["--recompute-granularity", "selective"], "activations": ["--recompute-activations"],
             "full": ["--recompute-granularity", "full", "--recompute-method", rng.choice(["uniform", "block"]),
                      "--recompute-num-layers", "1"],
             "modules": ["--recompute-granularity", "selective", "--recompute-modules",
                         *rng.choice([["core_attn"], ["moe_act"], ["moe"], ["layernorm", "moe"]])]}[kind]
    case.flags["recompute"] = words


def _dispatcher(rng: random.Random, case: Case, valid: bool) -> None:
    kinds = ["alltoall", "alltoall", "flex"] + ([] if valid else ["allgather"])
    kind = rng.choice(kinds)
    words = ["--moe-token-dispatcher-type", kind]
    backends = ["deepep", "hybridep"] + (["ncclep"] if case.line >= (0, 19) else [])
    if kind == "flex" and rng.random() < 0.7:
        words += ["--moe-flex-dispatcher-backend", rng.choice(backends)]
    if not valid and rng.random() < 0.15:
        words += ["--moe-enable-deepep"]
    if not valid and kind != "flex" and rng.random() < 0.15:
        words += ["--moe-flex-dispatcher-backend", rng.choice(backends)]
    case.flags["dispatcher"] = words


def _draw(rng: random.Random, case: Case, aspect: str, valid: bool) -> None:
    """Set one aspect: a value Megatron-LM accepts with the overlap (valid) or any value (not valid)."""
    flags, line = case.flags, case.line
    if aspect == "overlap":
        flags[aspect] = ["--overlap-moe-expert-parallel-comm"] if valid or rng.random() < 0.8 else []
        if rng.random() < 0.35:
            flags[aspect] = flags[aspect] + ["--delay-wgrad-compute"]
    elif aspect == "experts":
        case.ep = rng.choice([2, 4, 8]) if valid else rng.choice([1, 2, 4, 8])
        experts = case.ep * rng.choice([1, 2, 4]) if case.ep > 1 or valid else rng.choice([1, 4])
        flags[aspect] = ["--num-experts", str(experts), "--expert-model-parallel-size", str(case.ep)]
        if rng.random() < 0.7:
            flags[aspect].append("--moe-grouped-gemm")
    elif aspect == "dispatcher":
        _dispatcher(rng, case, valid)
    elif aspect == "precision":
        flags[aspect] = [rng.choice(["--bf16", "--bf16", "--fp16"])] if valid else rng.choice(
            [["--bf16"], ["--fp16"], []])
    elif aspect == "pipeline":
        case.layout = None
        _pipeline(rng, case, valid)
    elif aspect == "recompute":
        flags[aspect] = [] if valid and rng.random() < 0.6 else (
            ["--recompute-granularity", "selective", "--recompute-modules", "moe_act"] if valid else None)
        if flags[aspect] is None:
            _recompute(rng, case)
    elif aspect == "graphs":
        if valid and rng.random() < 0.6:
            flags[aspect] = []
        else:
            _graphs(rng, case, valid)
    elif aspect == "impl":
        flags[aspect] = [] if valid or rng.random() < 0.7 else ["--transformer-impl", rng.choice(
            ["local", "transformer_engine"])]
    elif aspect == "mtp":
        flags[aspect] = [] if valid and rng.random() < 0.7 else ["--mtp-num-layers", str(rng.choice(
            [1] if valid else [1, 2]))]
    elif aspect == "fp8":
        flags[aspect] = ["--fp8-format", "hybrid"] if rng.random() < 0.15 else []
    elif aspect == "fusion":
        flags[aspect] = ["--no-gradient-accumulation-fusion"] if rng.random() < 0.3 else []
    elif aspect == "shared":
        flags[aspect] = [] if rng.random() < 0.6 else ["--moe-shared-expert-intermediate-size", "32"] + (
            ["--moe-shared-expert-overlap"] if not valid and rng.random() < 0.4 else [])
    elif aspect == "grad_reduce":
        flags[aspect] = [] if rng.random() < 0.6 else ["--overlap-grad-reduce", "--use-distributed-optimizer"]
    elif aspect == "bias":
        flags[aspect] = rng.choice([[], [], ["--disable-bias-linear"], ["--add-qkv-bias"]])
    elif aspect == "connections":
        value = rng.choice([None, None, "1", "32"])
        case.env = {} if value is None else {"CUDA_DEVICE_MAX_CONNECTIONS": value}
    elif aspect == "early_release":
        flags[aspect] = ["--ep-overlap-early-attn-memory-release"] if not valid and rng.random() < 0.15 else []
    elif aspect == "dispatch_wgrad":
        ok = line >= (0, 18) and not valid and rng.random() < 0.15
        flags[aspect] = ["--overlap-dispatch-backward-with-experts-wgrad"] if ok else []
    elif aspect == "versions":
        case.torch = "2.6.0" if valid else rng.choice(["2.5.1", "2.6.0", "2.6.0", "2.13.0"])
        case.te = rng.choice(["2.12.0", "2.12.0", "2.10.0"]) if valid else rng.choice(
            ["2.2.0", "2.6.0", "2.7.0", "2.9.0", "2.10.0", "2.12.0", "2.12.0"])


def _pair(case: Case) -> None:
    """Settings Megatron-Core pairs with some values for reasons no EP-overlap check has."""
    flags = case.flags
    recompute = flags.get("recompute", [])
    if "moe_act" in recompute and "--moe-grouped-gemm" not in flags["experts"]:
        flags["experts"] = flags["experts"] + ["--moe-grouped-gemm"]  # moe_act recompute needs grouped GEMM
    if flags.get("fp8") and ("moe_act" in recompute or "layernorm" in recompute):
        flags["fp8"] = []  # Core: fp8 with these recomputes needs its own TE version and recipe
    if flags.get("graphs") and case.line < (0, 18):  # Megatron-LM <= 0.17 asks for it with graphs and EP
        flags["graphs"] = flags["graphs"] + ["--moe-pad-experts-for-cuda-graph-inference"]
    graphs = flags.get("graphs", [])
    if flags["experts"][1] == "1" and any(w in graphs for w in ("moe", "moe_router", "moe_preprocess")):
        graphs = [w for w in graphs if w not in ("moe", "moe_router", "moe_preprocess")]  # Core: MoE scopes need MoE
        name = next(w for w in graphs if w in ("--cuda-graph-scope", "--cuda-graph-modules"))
        if "attn" not in graphs:
            graphs.insert(graphs.index(name) + 1, "attn")
        flags["graphs"] = graphs
    if graphs and "full" in recompute and "full_iteration" not in graphs:
        flags["graphs"] = []  # Core: full recompute only with full-iteration graphs
    if "moe" in recompute and "moe_router" in graphs:
        flags["graphs"] = [w for w in graphs if w not in ("moe_router", "moe_preprocess")]  # Core refuses both
    shared_ok = ("alltoall",) if case.line < (0, 18) else ("alltoall", "flex")
    if "--moe-shared-expert-overlap" in flags.get("shared", []) and flags["dispatcher"][1] not in shared_ok:
        flags["shared"] = ["--moe-shared-expert-intermediate-size", "32"]  # Core: alltoall (0.18: or flex) only


def generate(rng: random.Random, line: Line, near_valid: bool) -> Case:
    """One command line: every aspect drawn freely, or (near_valid) all valid but one drawn freely."""
    case = Case(line=line)
    free = rng.choice(ASPECTS) if near_valid else None
    for aspect in ASPECTS:
        _draw(rng, case, aspect, valid=near_valid and aspect != free)
    _pair(case)
    return case
