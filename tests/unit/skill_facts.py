"""The facts the skill's prose quotes, derived from the rules (moe_overlap/skill/rules/) by running them, and the
checks that find a quote that disagrees. Used by test_skill_facts.py; kept apart so the checks can be tested on
planted errors.

Derived, never restated: the Transformer Engine / torch minimum of every version rule (the lowest version the
validator accepts for a config that triggers the rule), the GPUs each flex backend supports (Bridge's gate, run
over every GPU the environment table knows), the mtp_num_layers values each release accepts, and the release
lines of every rule.
"""

from __future__ import annotations

import re
from functools import cache

from moe_overlap.skill.rules.environment import GPU_CAPABILITY
from moe_overlap.skill.rules.flex_backend import backend_supported
from moe_overlap.skill.rules.registry import all_rules
from moe_overlap.skill.rules.validate import validate_config
from moe_overlap.skill.rules.versions import KNOWN_CORE_RELEASES

_BASE = {"comm_overlap": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
         "model": {"expert_model_parallel_size": 4, "num_moe_experts": 64, "moe_token_dispatcher_type": "alltoall",
                   "moe_shared_expert_overlap": False, "bf16": True}}


def _with(comm=None, model=None, ddp=None) -> dict:
    cfg = {"comm_overlap": {**_BASE["comm_overlap"], **(comm or {})}, "model": {**_BASE["model"], **(model or {})}}
    if ddp:
        cfg["ddp"] = ddp
    return cfg


# rule id -> (package whose version the rule reads, a config that triggers it, megatron-core release)
VERSION_RULES: dict[str, tuple[str, dict, str]] = {
    "torch-min-2-6": ("torch", _with(comm={"delay_wgrad_compute": False}), "0.19.2"),
    "wgrad-te-min-2-3": ("te", _with(), "0.19.2"),
    "wgrad-overlap-grad-reduce-te-2-7": ("te", _with(ddp={"overlap_grad_reduce": True}), "0.19.2"),
    "wgrad-overlap-grad-reduce-te-2-8": ("te", _with(ddp={"overlap_grad_reduce": True}), "0.19.2"),
    "wgrad-grad-accum-fusion-te-2-7": ("te", _with(model={"gradient_accumulation_fusion": True}), "0.19.2"),
    "wgrad-no-grad-accum-fusion-te-2-7": ("te", _with(model={"gradient_accumulation_fusion": False}), "0.19.2"),
    "wgrad-cuda-graph-te-2-10": ("te", _with(model={"cuda_graph_impl": "transformer_engine",
                                                    "cuda_graph_scope": ["moe_router", "moe_preprocess"]}), "0.19.2"),
    "wgrad-cuda-graph-te-2-12": ("te", _with(model={"cuda_graph_impl": "transformer_engine", "cuda_graph_scope": ["attn"],
                                                    "gradient_accumulation_fusion": True, "add_bias_linear": False,
                                                    "add_qkv_bias": False}), "0.19.2"),
    "dispatch-wgrad-te-2-3": ("te", {"comm_overlap": {"overlap_moe_expert_parallel_comm": False},
                                     "model": {"overlap_dispatch_backward_with_experts_wgrad": True,
                                               "expert_model_parallel_size": 4, "num_moe_experts": 64,
                                               "moe_token_dispatcher_type": "alltoall", "bf16": True}}, "0.19.2"),
}
_CANDIDATES = [f"2.{minor}.0" for minor in range(0, 25)]


def _fires(rule_id: str, package: str, config: dict, core: str, version: str) -> bool:
    given = {"torch_version": version, "te_version": "2.20.0"} if package == "torch" else \
        {"torch_version": "2.6.0", "te_version": version}
    # A Megatron-LM argument check (rule.mlm) is in the rule set of configs Megatron-LM reads only
    flavour = "megatron-lm" if {r.id: r for r in all_rules()}[rule_id].mlm else None
    result = validate_config(config, megatron_core_version=core, gpu="H100", env={}, detect=False, flavour=flavour,
                             **given)
    return any(f.rule == rule_id and f.severity == "error" for f in result.findings)


@cache
def version_minimums() -> dict[str, tuple[str, str]]:
    """rule id -> (package 'torch' | 'te', the lowest version the rule accepts), found by running the rule."""
    out = {}
    for rule_id, (package, config, core) in VERSION_RULES.items():
        assert _fires(rule_id, package, config, core, _CANDIDATES[0]), f"{rule_id}: the probe config never fires"
        out[rule_id] = (package, next(v for v in _CANDIDATES if not _fires(rule_id, package, config, core, v)))
    return out


def te_minimums() -> set[tuple[int, int]]:
    return {_mm(v) for pkg, v in version_minimums().values() if pkg == "te"}


def _mm(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


# ---- GPUs -------------------------------------------------------------------------------------------------
BACKENDS = {"deepep": ("DeepEP", "deepep"), "hybridep": ("HybridEP", "hybridep"), "ncclep": ("NCCL EP", "ncclep")}
ARCH = {"Volta": 7, "Turing": 7, "Ampere": 8, "Hopper": 9}


@cache
def gpu_support() -> dict[str, tuple[frozenset[int], frozenset[str]]]:
    """backend -> (compute-capability majors every GPU of which it supports, GPU names it supports)."""
    out = {}
    for backend in BACKENDS:
        names = frozenset(n for n, cc in GPU_CAPABILITY.items() if backend_supported(backend, n, cc))
        majors = {int(cc.split(".")[0]) for cc in GPU_CAPABILITY.values()}
        whole = frozenset(m for m in majors if all(backend_supported(backend, n, cc)
                                                   for n, cc in GPU_CAPABILITY.items() if cc.startswith(f"{m}.")))
        out[backend] = (whole, names)
    return out


_BACKEND_RE = re.compile(r"\b(DeepEP|deepep|HybridEP|hybridep|NCCL EP|ncclep)\b")
_NAME_RE = re.compile(r"(?<![\w-])(" + "|".join(sorted(map(re.escape, GPU_CAPABILITY), key=len, reverse=True))
                      + r")(?![\w-])")
_NEGATION = re.compile(r"\b(not|Not|none|except|unsupported|no longer)\b")


def _clauses(text: str) -> list[str]:
    """Paragraphs joined into lines, then cut at sentence ends, semicolons and table cells."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        for line in re.split(r"\n(?=\s*(?:[-*|]|\d+\.)\s)", block):
            flat = " ".join(line.split())
            out += [c for c in re.split(r";|\. (?=[A-Z`(])| \| ", flat) if c.strip()]
    return out


def gpu_problems(text: str, where: str) -> list[str]:
    """Each clause that names a flex backend and then compute capabilities or GPU names: every one claimed
    supported must be supported by that backend, every one after a negation must not be."""
    support = gpu_support()
    problems = []
    for clause in _clauses(text):
        marks = list(_BACKEND_RE.finditer(clause))
        for i, m in enumerate(marks):
            backend = next(k for k, words in BACKENDS.items() if m.group(1) in words)
            majors, names = support[backend]
            segment = clause[m.end(): marks[i + 1].start() if i + 1 < len(marks) else len(clause)]
            neg = _NEGATION.search(segment)
            cut = neg.start() if neg else len(segment)
            # What follows a negated phrase is often its explanation ("not on GB200: Bridge accepts ..."): the
            # denial ends at the next colon or bracket, and nothing after it is read as a claim.
            stop = re.search(r"[:(]", segment[cut:])
            claimed, denied = segment[:cut], segment[cut: cut + stop.start()] if stop else segment[cut:]
            said = {int(x) for x in re.findall(r"(?<![\d.])(\d{1,2})\.x\b", claimed)}
            said |= {v for k, v in ARCH.items() if k in claimed}
            if backend != "deepep" and "Blackwell" in claimed:
                said.add(10)
            for major in sorted(said - majors):
                problems.append(f"{where}: {m.group(1)} claimed on compute capability {major}.x: {clause!r}")
            for name in _NAME_RE.findall(claimed):
                if name not in names:
                    problems.append(f"{where}: {m.group(1)} claimed on {name}: {clause!r}")
            for name in _NAME_RE.findall(denied):
                if name in names and not re.search(r"\bnot (named|only)\b", denied):
                    problems.append(f"{where}: {m.group(1)} denied on {name}, which it supports: {clause!r}")
    return problems


# ---- versions ---------------------------------------------------------------------------------------------
_TE_RE = re.compile(r"\b(?:TE|Transformer Engine)(?: version)?\s*(?:>=|≥|<|older than|at least)?\s*v?"
                    r"(\d+\.\d+(?:\.\d+)?)(?![\d.]*\d)")
_TORCH_RE = re.compile(r"\b(?:torch|PyTorch)\s*(?:>=|≥|<|older than)\s*(\d+\.\d+(?:\.\d+)?)")


def version_problems(text: str, where: str) -> list[str]:
    """Every Transformer Engine version quoted must be a minimum some rule applies; every torch bound, torch's."""
    te = te_minimums()
    torch = {_mm(v) for pkg, v in version_minimums().values() if pkg == "torch"}
    problems = [f"{where}: TE {v} is no rule's minimum (rules: {sorted(te)})"
                for v in _TE_RE.findall(text) if _mm(v) not in te]
    problems += [f"{where}: torch bound {v} is not the rules' {sorted(torch)}"
                 for v in _TORCH_RE.findall(text) if _mm(v) not in torch]
    return problems


# ---- rule ranges ------------------------------------------------------------------------------------------
@cache
def mtp_allowed() -> dict[str, frozenset]:
    """release line -> mtp_num_layers values (None = unset) EP overlap accepts, found by running the rule."""
    out = {}
    for a, b in KNOWN_CORE_RELEASES:
        ok = set()
        for value in (None, 0, 1, 2, 3):
            cfg = _with(comm={"delay_wgrad_compute": False}, model={"mtp_num_layers": value,
                                                                     "pipeline_model_parallel_size": 2,
                                                                     "virtual_pipeline_model_parallel_size": 2})
            result = validate_config(cfg, megatron_core_version=f"{a}.{b}.0", torch_version="2.6.0", env={},
                                     detect=False)
            if not any(f.rule == "mtp-layers-limit" for f in result.findings):
                ok.add(value)
        out[f"{a}.{b}"] = frozenset(ok)
    return out


def mtp_problems(text: str, where: str) -> list[str]:
    """A clause that names mtp_num_layers and the values it may take: no value no release accepts, and 0 only
    with the release (0.19) that accepts it."""
    allowed = mtp_allowed()
    everywhere = frozenset.intersection(*allowed.values())
    somewhere = frozenset.union(*allowed.values())
    zero_in = [line for line, ok in allowed.items() if 0 in ok]
    problems = []
    for clause in _clauses(text):
        if "mtp_num_layers" not in clause:
            continue
        rest = clause[clause.index("mtp_num_layers"):]
        rest = re.sub(r"(?:[<>]=?|!=)\s*\d+|\d+\.\d+(?:\.\d+)?|\bPR \d+|\d{3,}|:\d+", " ", rest)
        values = {int(v) for v in re.findall(r"(?<![\w.-])(\d)(?![\w.])", rest)}
        for v in sorted(values - {x for x in somewhere if x is not None}):
            problems.append(f"{where}: mtp_num_layers {v} is accepted by no release: {clause!r}")
        if 0 in values and 0 not in everywhere and not any(line in clause for line in allowed):
            problems.append(f"{where}: mtp_num_layers 0 is only accepted from {zero_in[0]}, the clause names no "
                            f"release: {clause!r}")
    return problems


def release_cell_problems(text: str, where: str) -> list[str]:
    """A table row for a rule (`| \\`rule-id\\` | ...`) with a releases cell: the rule's own release lines."""
    releases = {r.id: r.releases() for r in all_rules()}
    problems = []
    for line in text.splitlines():
        m = re.match(r"\| `([a-z0-9-]+)` \|", line)
        if not m or m.group(1) not in releases:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        for cell in cells[1:]:
            if re.fullmatch(r"0\.\d+(?:-0\.\d+)?", cell) and cell != releases[m.group(1)]:
                problems.append(f"{where}: `{m.group(1)}` releases {cell}, the rule holds for {releases[m.group(1)]}")
    return problems


def strings(node, path: str = "card.yaml"):
    """(path, text) for every string of a parsed card, so each field is checked on its own."""
    if isinstance(node, str):
        yield path, node
    elif isinstance(node, dict):
        for k, v in node.items():
            yield from strings(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            label = v.get("id", v.get("name", i)) if isinstance(v, dict) else i
            yield from strings(v, f"{path}.{label}")


def all_problems(text: str, where: str) -> list[str]:
    return (version_problems(text, where) + gpu_problems(text, where) + mtp_problems(text, where)
            + release_cell_problems(text, where))
