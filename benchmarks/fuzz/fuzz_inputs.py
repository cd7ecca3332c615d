"""Hostile inputs for every CLI command and MCP tool (hypothesis strategies), shared by benchmarks/fuzz/fuzz.py and the
fuzz tests (tests/unit/test_fuzz_cli.py, tests/mcp/test_fuzz_mcp.py import it as benchmarks.fuzz.fuzz_inputs).

Each strategy draws a *case*: a dict the runners in fuzz.py turn into a command line (+ files written into a temp
folder) or MCP tool arguments. The cases mix valid inputs made slightly wrong (the parser's real paths), the
known hostile constructs of issue 15 (alias bombs, YAML tags the constructor cannot build, 5000-digit integers,
FIFOs and devices, 60k-character lines, launcher prefixes), and plain random data.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
LOGS = sorted((ROOT / "tests" / "data" / "logs").glob("*.log"))
EXAMPLE_TEXTS = [p.read_text(encoding="utf-8") for p in EXAMPLES]
LOG_TEXTS = [p.read_text(encoding="utf-8") for p in LOGS]

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)) + "model: *i\n"
HOSTILE_SCALARS = [
    "!!int 0x", "!!bool maybe", "!!timestamp nope", "2024-02-31", "9" * 5000, "-" + "9" * 5000, ".inf", ".nan",
    "-.inf", "1e400", "-1e400", "0x1F", "0o17", "1_000", "~", "null", "yes", "on", "[]", "{}", "&a 1", "*a",
    "!!binary aGk=", "!!set {a}", "!!python/object:os.system x", "'unterminated", '"\\x"', "!!float x",
    "!!str", "!!map [1]", "!!omap [1]", "<<: 1", "? [a]", "1e8", "1" * 30, "-1", "0", "1.5", "true", "false",
    "\t", "\x00", "\ufeff", "é", "\u202e", "x" * 70_000, "[" * 300 + "]" * 300, "{a: " * 100 + "1" + "}" * 100,
]
KNOWN_KEYS = [
    "model", "comm_overlap", "ddp", "train", "optimizer", "mixed_precision", "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute", "expert_model_parallel_size", "num_moe_experts", "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend", "bf16", "fp16", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "recompute_granularity", "recompute_modules",
    "cuda_graph_impl", "cuda_graph_scope", "cuda_graph_modules", "moe_shared_expert_overlap", "mtp_num_layers",
    "global_batch_size", "micro_batch_size", "data_parallel_size", "overlap_grad_reduce", "moe_router_topk",
    "hidden_size", "num_layers", "format", "seq_length", "steps", "precision", "schedule", "chunks",
    # near misses (one edit away) and case variants
    "modle", "Model", "overlap_moe_expert_paralel_comm", "delay_wgrad_comptue", "comm_overlp", "ddpp",
]
LAUNCH_PREFIXES = ["0: ", " 0: ", "[rank0]: ", "[default0]:", "0: [rank0]: ", "2026-11-29 10:00:00,123 - INFO - ",
                   "[2026-11-29T10:00:00.123Z] [INFO] [megatron.training] ", "INFO:megatron.core:",
                   "12:34:56 ", "[NeMo I 2026-11-29 10:00:00 train:1] "]
LOG_HOSTILE_LINES = [
    " " * 60_000 + "x", "overlap_moe_expert_parallel_comm ..." + " " * 60_000 + "x",
    "overlap_moe_expert_parallel_comm='" * 2000, "a." * 30_000 + "overlap_moe_expert_parallel_comm .. True",
    "[" * 40_000, "0: " * 20_000, "ProcessGroupNCCL" * 4000, "Traceback (most recent call last):",
    "AssertionError: overlap_moe_expert_parallel_comm requires expert_model_parallel_size > 1",
    "overlap_moe_expert_parallel_comm ........ " + "9" * 5000, "moe_token_dispatcher_type: " + "x" * 50_000,
    "\x00\x00\x00", "\r\r\r", "\u2028\u2029\x85", "comm_overlap:" * 1000,
    "[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(...)",
]
FILE_KINDS = ["regular"] * 6 + ["fifo", "dir", "missing", "symlink", "devzero", "devnull"]

ints_text = st.one_of(st.integers(1, 64).map(str), st.integers(-10, 10**4).map(str), st.integers(-(10**40), 10**40).map(str),
                      st.sampled_from(["9" * 5000, "1e8", "0x10", "", " ", "١٢", "1_0", "+3", "nan", "inf", "-0"]))
floats_text = st.one_of(st.floats(0.01, 1000).map(repr), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                        st.sampled_from(["1e400", "-1e400", "nan", "inf", "1e-300", "0", "-1", "1e8", "x", "",
                                         "9" * 5000, "1." + "0" * 5000 + "1"]))
short_text = st.text(max_size=40)
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True),
                    st.text(max_size=30), st.sampled_from(HOSTILE_SCALARS[:40]))
keys = st.one_of(st.sampled_from(KNOWN_KEYS), st.text(max_size=20))
json_values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                              st.dictionaries(keys, inner, max_size=5)),
                           max_leaves=25)


def _nested(depth: int) -> str:
    return "model:\n  x: " + "[" * depth + "]" * depth + "\n"


@st.composite
def mutated_text(draw, bases: list[str], extra_lines: list[str]) -> str:
    """A known-good text with a few random edits: a line replaced, inserted, duplicated, cut, or a value swapped."""
    lines = draw(st.sampled_from(bases)).splitlines() or [""]
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["insert", "replace", "dup", "cut", "value", "prefix"]))
        if op == "insert":
            lines.insert(i, draw(st.one_of(st.sampled_from(extra_lines), st.text(max_size=60))))
        elif op == "replace":
            lines[i] = draw(st.one_of(st.sampled_from(extra_lines), st.text(max_size=60)))
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(0, len(lines[i]))))]
        elif op == "value" and ":" in lines[i]:
            lines[i] = lines[i].split(":", 1)[0] + ": " + draw(st.sampled_from(HOSTILE_SCALARS))
        elif op == "prefix":
            lines[i] = draw(st.sampled_from(LAUNCH_PREFIXES)) + lines[i]
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))


config_lines = [ALIAS_BOMB, "model: &m {bf16: true}", "ddp: *m", "model:", "comm_overlap:", "  bf16: !!bool maybe",
                "  expert_model_parallel_size: " + "9" * 5000, "  overlap_moe_expert_paralel_comm: true", "modle:",
                "\tbf16: true", "<<: {a: 1}", "? [a, b]", ": 1", "---", "...", "%YAML 1.1", "!!python/name:os.system"]

config_texts = st.one_of(
    mutated_text(EXAMPLE_TEXTS, config_lines),
    st.dictionaries(keys, json_values, max_size=6).map(lambda d: json.dumps(d, default=str)),
    st.dictionaries(st.sampled_from(["model", "comm_overlap", "ddp", "train"]),
                    st.dictionaries(keys, json_values, max_size=6), max_size=4).map(
        lambda d: json.dumps(d, default=str)),
    st.sampled_from([ALIAS_BOMB, _nested(40), _nested(5000), "model: [" + ",".join(["1"] * 400_000) + "]\n",
                     "model:\n  x: '" + "a" * 900_000 + "'\n", "", " \n", "# only a comment\n", "[1, 2]",
                     "model: !!int 0x\n", "model:\n  num_moe_experts: 2024-02-31\n", "\ufeffmodel: {}\n"]),
    st.text(max_size=300),
)
config_bytes = st.one_of(config_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=300),
                         st.sampled_from([b"\xff\xfe\x00m\x00o", b"model:\n  x: caf\xe9\n", b"\x00" * 100]))

flag_tokens = st.sampled_from(["--overlap-moe-expert-parallel-comm", "--overlap-moe-expert-paralel-comm",
                               "--delay-wgrad-compute", "--expert-model-parallel-size", "--num-experts", "--bf16",
                               "--moe-token-dispatcher-type", "--recompute-modules", "--lr", "--", "-x", "'", '"',
                               "--cuda-graph-scope", "--micro-batch-size", "=", "--num-experts=", "\\"])
argv_strings = st.lists(st.one_of(flag_tokens, ints_text, short_text), max_size=12).map(" ".join)
overrides = st.lists(st.one_of(
    st.tuples(st.sampled_from(["model.", "comm_overlap.", "ddp.", "train.", "", "a.b.c.d.", "." * 50]),
              st.sampled_from(KNOWN_KEYS), st.sampled_from(["=", "==", ":", ""]),
              st.one_of(st.sampled_from(HOSTILE_SCALARS), ints_text, short_text)).map("".join),
    short_text), max_size=4)
versions = st.one_of(st.none(), st.sampled_from(["2.6.0", "0.16.1", "2.7.0rc1", "9" * 5000, "1." * 3000, "x", "",
                                                 "2.6.0+cu124", "v2", "0.99"]), short_text)


def _sometimes(draw, strategy, odds: int = 4):
    """`strategy`'s value one time in `odds`, else None: one bad option at a time reaches the parser's depths."""
    return draw(strategy) if draw(st.integers(0, odds - 1)) == 0 else None


@st.composite
def validate_cases(draw) -> dict:
    good = draw(st.integers(0, 2)) == 0
    content = draw(mutated_text(EXAMPLE_TEXTS, config_lines).map(str.encode) if good else config_bytes)
    return {"content": content, "suffix": draw(st.sampled_from([".yaml", ".yml", ".json", "", ".txt"])),
            "kind": "regular" if good else draw(st.sampled_from(FILE_KINDS)),
            "overrides": _sometimes(draw, overrides) or [], "argv": _sometimes(draw, argv_strings),
            "torch": _sometimes(draw, versions), "te": _sometimes(draw, versions),
            "gpu": _sometimes(draw, st.one_of(st.sampled_from(["H100", "9.0", "sm_90", "B200", "x" * 5000]),
                                              short_text)),
            "core": _sometimes(draw, versions), "format": draw(st.sampled_from(["text", "json"]))}


ESTIMATE_FLAGS = {"--hidden": ints_text, "--moe-ffn": ints_text, "--experts": ints_text, "--topk": ints_text,
                  "--tokens": ints_text, "--ep": ints_text, "--micro-batches": ints_text, "--layers": ints_text,
                  "--gpus-per-node": ints_text, "--chunks": ints_text, "--tflops": floats_text,
                  "--intra-gbps": floats_text, "--inter-gbps": floats_text, "--link-gbps": floats_text,
                  "--a2a-efficiency": floats_text, "--overlap-efficiency": floats_text, "--attn-ms": floats_text,
                  "--other-ms": floats_text, "--mem-gbps": floats_text, "--dense-tflops": floats_text,
                  "--hbm-efficiency": floats_text, "--hbm-gbps": floats_text, "--mem-rate": short_text,
                  "--fabric": st.one_of(st.sampled_from(["h100-nvlink", "h100-nvlink+ib-400g", "x+y", "+", ""]),
                                        short_text),
                  "--gpu-preset": st.one_of(st.sampled_from(["h100", "h200", "x"]), short_text),
                  "--precision": st.sampled_from(["bf16", "fp16", "fp32", "int8"])}
GOOD_ESTIMATE = {"--hidden": "4096", "--moe-ffn": "2048", "--experts": "64", "--topk": "8", "--tokens": "4096",
                 "--ep": "8", "--fabric": "h100-nvlink+ib-400g", "--gpu-preset": "h100"}


@st.composite
def estimate_cases(draw) -> dict:
    flags = dict(GOOD_ESTIMATE) if draw(st.integers(0, 4)) else {}
    for flag in draw(st.lists(st.sampled_from(sorted(ESTIMATE_FLAGS)), max_size=3, unique=True)):
        flags[flag] = draw(ESTIMATE_FLAGS[flag])
    if draw(st.integers(0, 3)) == 0:
        for flag in draw(st.lists(st.sampled_from(sorted(GOOD_ESTIMATE)), max_size=2, unique=True)):
            flags.pop(flag, None)
    return {"flags": flags, "format": draw(st.sampled_from(["text", "json"]))}


log_texts = st.one_of(
    mutated_text(LOG_TEXTS, LOG_HOSTILE_LINES),
    st.tuples(st.sampled_from(LOG_TEXTS), st.sampled_from(LAUNCH_PREFIXES)).map(
        lambda t: "".join(t[1] + line + "\n" for line in t[0].splitlines())),
    st.lists(st.one_of(st.sampled_from(LOG_HOSTILE_LINES), st.text(max_size=80)), max_size=30).map("\n".join),
    st.text(max_size=500),
)


@st.composite
def check_logs_cases(draw) -> dict:
    content = draw(st.one_of(log_texts.map(lambda t: t.encode("utf-8", "surrogatepass")), st.binary(max_size=400)))
    return {"content": content, "kind": draw(st.sampled_from(FILE_KINDS + ["stdin"])),
            "suffix": draw(st.sampled_from([".log", ".txt", ""])),
            "expect_overlap": draw(st.sampled_from([None, "true", "false", "any", "maybe"])),
            "expect_wgrad": draw(st.sampled_from([None, "true", "false", "any"])),
            "format": draw(st.sampled_from(["text", "json"]))}


GENERATE_FLAGS = {
    "--ep": ints_text, "--experts": ints_text, "--topk": ints_text, "--gpus": ints_text, "--tp": ints_text,
    "--pp": ints_text, "--vpp": ints_text, "--num-layers": ints_text, "--micro-batches": ints_text,
    "--preset": st.one_of(st.sampled_from(["deepseek-v3", "qwen3-30b-a3b", "mixtral-8x7b", "x"]), short_text),
    "--gpu": st.one_of(st.sampled_from(["H100", "B200", "GB200", "9.0", "x" * 5000]), short_text),
    "--torch-version": versions.map(str), "--te-version": versions.map(str),
    "--megatron-core-version": versions.map(str), "--dispatcher": st.sampled_from(["alltoall", "flex", "x"]),
    "--flex-backend": st.sampled_from(["deepep", "hybridep", "x"]),
    "--precision": st.sampled_from(["bf16", "fp16", "fp32", "x"]),
    "--recompute": st.sampled_from(["none", "selective", "full", "x"]),
    "--stage": st.sampled_from(["baseline", "overlap", "wgrad", "x"]),
    "--to": st.sampled_from(["yaml", "json", "overrides", "megatron-args", "bridge-python", "x"])}


@st.composite
def generate_cases(draw) -> dict:
    flags = {"--ep": "8", "--experts": "64", "--topk": "8"} if draw(st.integers(0, 3)) else {}
    for flag in draw(st.lists(st.sampled_from(sorted(GENERATE_FLAGS)), max_size=3, unique=True)):
        flags[flag] = draw(GENERATE_FLAGS[flag])
    if draw(st.booleans()):
        flags["--plan"] = ""
    return {"flags": flags, "format": draw(st.sampled_from(["text", "json"]))}


diagnose_cases = st.fixed_dictionaries({
    "text": st.one_of(st.text(max_size=300), st.sampled_from(LOG_HOSTILE_LINES), log_texts),
    "limit": st.one_of(st.none(), ints_text), "format": st.sampled_from(["text", "json"])})
card_cases = st.fixed_dictionaries({
    "name": st.one_of(st.none(), st.sampled_from(["perf-expert-parallel-overlap", "../etc", ""]), short_text),
    "field": st.one_of(st.none(), st.sampled_from(["constraints", "constraints.ep-size-gt-1", "a" * 5000,
                                                   "constraints.99999999999999999999", "minimal_example.config",
                                                   "constraints.-1", "..", "constraints.0.id"]), short_text)})


VERIFY_KEYS = ["format", "hidden_size", "moe_ffn_hidden_size", "num_moe_experts", "moe_router_topk", "num_layers",
               "num_attention_heads", "seq_length", "expert_model_parallel_size", "precision", "schedule", "chunks",
               "micro_batches", "micro_batch_size", "steps", "lr", "seed", "overlap_moe_expert_parallel_comm"]
verify_values = st.one_of(scalars, st.lists(scalars, max_size=3), st.sampled_from(["abc", [1, 2], {"a": 1}]))
PLAN_KEYS = ["config_source", "config_kind", "nproc", "device", "specs", "notes", "mapping_notes", "raw_source"]


@st.composite
def verify_cases(draw) -> dict:
    """`verify` input parsing without a launch: `--print-launch` (config + options -> plan files) or `--judge DIR`
    over a folder of drawn plan.json / config.json / rank records."""
    if draw(st.booleans()):
        config = draw(st.one_of(
            st.dictionaries(st.sampled_from(VERIFY_KEYS), verify_values, max_size=6).map(
                lambda d: json.dumps({"format": "moe-overlap", **d}, default=str)),
            st.dictionaries(st.sampled_from(VERIFY_KEYS[1:]), verify_values, max_size=6).map(
                lambda d: json.dumps(d, default=str)),
            config_texts))
        options = {flag: draw(values) for flag, values in (
            ("--nproc", ints_text), ("--steps", ints_text), ("--micro-batches", ints_text),
            ("--modes", st.sampled_from(["baseline", "overlap,overlap+wgrad", "x", "", ",,"])),
            ("--schedule", st.sampled_from(["chunked", "1f1b", "x"])), ("--timeout", floats_text),
            ("--hang-timeout", floats_text)) if draw(st.integers(0, 3)) == 0}
        return {"mode": "print", "config": config.encode("utf-8", "surrogatepass"),
                "suffix": draw(st.sampled_from([".yaml", ".json"])), "options": options,
                "out": draw(st.sampled_from(["new", "empty", "foreign", "file"])),
                "launcher": draw(st.sampled_from(["torchrun", "slurm"])), "format": "json"}
    plan = draw(st.one_of(
        st.dictionaries(st.sampled_from(PLAN_KEYS), verify_values, max_size=8),
        st.sampled_from([{}, {"nproc": 1e9}, {"nproc": 10**12, "config_kind": "default", "device": "cpu",
                                               "specs": []}, {"nproc": "2"}, [], "x", None])))
    config = draw(st.one_of(st.dictionaries(st.sampled_from(VERIFY_KEYS), verify_values, max_size=5),
                            st.just({"format": "moe-overlap"}), st.just(None)))
    records = draw(st.lists(st.one_of(st.dictionaries(st.sampled_from(["kind", "t", "mode", "step", "loss", "rank"]),
                                                      verify_values, max_size=5).map(json.dumps),
                                      st.text(max_size=50)), max_size=6))
    return {"mode": "judge", "plan": plan, "config": config, "records": records,
            "plan_raw": draw(st.sampled_from([None, "{", "\x00", "9" * 5000, "[" * 5000])), "format": "json"}


def verify_argv(case: dict, folder: Path) -> list[str]:
    out = folder / "out"
    if case["mode"] == "print":
        cfg = folder / ("config" + case["suffix"])
        cfg.write_bytes(case["config"])
        if case["out"] in ("empty", "foreign"):
            out.mkdir()
            if case["out"] == "foreign":
                (out / "config.json").write_text("{}")
                (out / "notes.txt").write_text("someone else's\n")
        elif case["out"] == "file":
            out.write_text("x")
        argv = ["verify", str(cfg), "--print-launch", case["launcher"], "--out", str(out)]
        for flag, value in case["options"].items():
            argv.append(f"{flag}={value}")
        return argv
    out.mkdir()
    if case["plan_raw"] is not None:
        (out / "plan.json").write_text(case["plan_raw"])
    else:
        (out / "plan.json").write_text(json.dumps(case["plan"], default=str))
    if case["config"] is not None:
        (out / "config.json").write_text(json.dumps(case["config"], default=str))
    (out / "ranks").mkdir()
    (out / "ranks" / "rank0.jsonl").write_text("\n".join(case["records"]) + "\n")
    return ["verify", "--judge", str(out), "--format", "json"]
