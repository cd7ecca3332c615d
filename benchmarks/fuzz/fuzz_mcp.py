"""Fuzz every MCP tool's arguments through a real client (in process): part of benchmarks/fuzz/fuzz.py, and loaded by
tests/mcp/test_fuzz_mcp.py.

Arguments are drawn from each tool's input schema as the server lists it (typed values at and beyond the limits,
wrong types, unknown keys, deep nesting) mixed with the hostile content of fuzz_inputs.py (configs, logs, paths
to a FIFO, a folder, a link out of the allowed folder). run_verification is planned (config read and checked)
but never launched: the job manager refuses to start. A result counts as a traceback when it is an error whose
text reads like an internal failure (the wrapper's "internal error", a Python traceback or a bare exception
class), or when the protocol answers -32603.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from benchmarks.fuzz import fuzz_inputs as fi

INTERNAL = re.compile(r"internal error|Traceback \(most recent call last\)|\b(KeyError|TypeError|AttributeError|"
                      r"IndexError|RecursionError|UnboundLocalError|ZeroDivisionError|OverflowError|"
                      r"ValidationError|NameError|AssertionError)\b")
CALL_LIMIT_S = 10.0


def make_allowed_folder() -> Path:
    """A folder of files a client may name: a good config, a log, a FIFO, a folder, a link out, a big file."""
    folder = Path(tempfile.mkdtemp(prefix="fuzz-mcp-"))
    (folder / "config.yaml").write_text(fi.EXAMPLE_TEXTS[0])
    (folder / "train.log").write_text(fi.LOG_TEXTS[0])
    (folder / "bomb.yaml").write_text(fi.ALIAS_BOMB)
    (folder / "dir").mkdir()
    os.mkfifo(folder / "fifo.yaml")
    os.symlink("/etc/passwd", folder / "out.yaml")
    (folder / "big.log").write_bytes(b"x" * (1 << 20) + b"\n" + fi.LOG_TEXTS[0].encode())
    return folder


PATHS = ["config.yaml", "train.log", "bomb.yaml", "dir", "fifo.yaml", "out.yaml", "big.log", "missing.yaml",
         "../x.yaml", "/etc/passwd", "", "a\x00b", "~/.ssh/id_rsa", "x" * 5000, "dir/../config.yaml", "/dev/zero"]


def _typed(schema: dict[str, Any], defs: dict[str, Any], depth: int = 0) -> st.SearchStrategy:
    """Values of a JSON schema node (roughly), edges included."""
    if "$ref" in schema:
        return _typed(defs.get(schema["$ref"].rsplit("/", 1)[-1], {}), defs, depth + 1)
    if "anyOf" in schema:
        return st.one_of([_typed(s, defs, depth + 1) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.sampled_from(list(schema["enum"]))
    kind = schema.get("type")
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if kind == "integer":
        edges = [v for v in (lo, hi) if v is not None] + [(lo or 0) - 1, (hi or 0) + 1, 2**63, -(2**70)]
        return st.one_of(st.integers(int(lo if lo is not None else -10), int(hi if hi is not None else 10**6)),
                         st.sampled_from([int(e) for e in edges]))
    if kind == "number":
        return st.one_of(st.floats(lo if lo is not None else -1e6, hi if hi is not None else 1e6),
                         st.sampled_from([1e-300, 1e300, -1.0, 0.0, 1e308]))
    if kind == "string":
        return st.one_of(st.text(max_size=40), st.sampled_from(["", "x" * (schema.get("maxLength", 100) + 1)]))
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_typed(schema.get("items", {}), defs, depth + 1), max_size=4)
    if kind == "object":
        props = schema.get("properties") or {}
        if props and depth < 4:
            return st.fixed_dictionaries({}, optional={k: _typed(v, defs, depth + 1) for k, v in props.items()})
        return st.dictionaries(fi.keys, fi.json_values, max_size=5)
    return fi.json_values


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


DOMAIN = {
    "config_text": fi.config_texts, "config_path": st.sampled_from(PATHS), "path": st.sampled_from(PATHS),
    "argv": st.one_of(fi.argv_strings, st.lists(fi.short_text, max_size=5)), "overrides": fi.overrides,
    "field": fi.card_cases.map(lambda c: c["field"]), "env": st.dictionaries(st.text(max_size=30), st.text(max_size=30),
                                                                              max_size=4),
    "config": st.one_of(st.dictionaries(fi.keys, fi.json_values, max_size=5), st.just(_nested(300)),
                        st.sampled_from([{"model": {"moe_router_topk": "abc"}}, {"format": "moe-overlap",
                                                                                  "moe_router_topk": [1, 2]}])),
    "job_id": st.one_of(st.text(max_size=70), st.just("verify-" + "0" * 32)),
}


GOOD_ARGS: dict[str, dict[str, Any]] = {  # a valid call of each tool, mutated a little by most draws
    "validate_config": {"config_path": "config.yaml"},
    "generate_config": {"ep": 8, "experts": 64, "topk": 8},
    "check_training_log": {"path": "train.log"},
    "diagnose_failure": {"text": "AssertionError: overlap_moe_expert_parallel_comm requires EP > 1"},
    "estimate_overlap_benefit": {"hidden": 4096, "moe_ffn": 2048, "experts": 64, "topk": 8, "tokens": 4096, "ep": 8,
                                 "fabric": "h100-nvlink", "gpu_preset": "h100"},
    "run_verification": {"nproc": 2, "steps": 2, "background": True},
    "get_skill_card": {"field": "constraints"},
    "get_verification_status": {"job_id": "verify-" + "0" * 32},
    "cancel_verification": {"job_id": "verify-" + "0" * 32, "wait_s": 0},
    "list_skills": {},
}


@st.composite
def tool_args(draw, name: str, schema: dict[str, Any]) -> Any:
    """Arguments for one call of tool `name`: a valid call with a few keys changed, or a freer draw."""
    defs = schema.get("$defs", {})
    props = schema.get("properties", {})
    roll = draw(st.integers(0, 19))
    if roll == 0:  # not an object at all
        return draw(st.one_of(st.lists(fi.scalars, max_size=3), fi.scalars))
    good = roll > 8
    args: dict[str, Any] = dict(GOOD_ARGS.get(name, {})) if good else {}
    keys = sorted(props)
    chosen = draw(st.lists(st.sampled_from(keys), max_size=2 if good else len(keys), unique=True)) if keys else []
    for key in chosen:
        if name == "check_training_log" and key == "text":
            strategy = fi.log_texts
        elif name == "diagnose_failure" and key == "text":
            strategy = st.one_of(st.text(min_size=1, max_size=200), st.sampled_from(fi.LOG_HOSTILE_LINES))
        else:
            strategy = DOMAIN.get(key, _typed(props[key], defs))
        which = draw(st.integers(0, 9))
        args[key] = draw(strategy if which < 6 else _typed(props[key], defs) if which < 8 else fi.json_values)
        if name in ("validate_config", "run_verification", "check_training_log") and key in (
                "config", "config_text", "config_path", "text", "path"):
            for other in ("config", "config_text", "config_path", "text", "path"):  # one source, mostly
                if other != key and draw(st.integers(0, 3)):
                    args.pop(other, None)
    if roll == 1:
        args[draw(fi.keys)] = draw(fi.json_values)  # an unknown argument
    if roll == 2 and props:
        args[draw(st.sampled_from(keys))] = _nested(draw(st.integers(20, 150)))  # the SDK client sends < ~250
    if name == "run_verification":
        args.setdefault("timeout_s", 5)
    return args


def tool_calls(tools: dict[str, dict[str, Any]]) -> st.SearchStrategy:
    """One call of every tool, in a drawn order."""
    names = sorted(tools)
    return st.tuples(*[tool_args(n, tools[n]).map(lambda a, n=n: (n, a)) for n in names]).flatmap(
        lambda calls: st.permutations(list(calls)))


def internal_failure(result) -> str | None:
    """The text of a result that reads like a crash, else None."""
    if not getattr(result, "is_error", False):
        return None
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    return text if INTERNAL.search(text) else None


def build(folder: Path):
    """A server over `folder` whose verifications are planned but never launched."""
    from moe_overlap.mcp.jobs import JobError
    from moe_overlap.server import ServerOptions, build_server

    server = build_server(ServerOptions(allowed_dirs=[str(folder)], runs_dir=str(folder / "runs")))

    def no_launch(run, *, description, owner=None):
        raise JobError("fuzz: verifications are planned, not launched")

    server.jobs.start = no_launch
    return server


async def call(client, name: str, args: Any) -> tuple[str | None, float]:
    """(problem or None, seconds) of one call: an internal failure, -32603, or a call over CALL_LIMIT_S."""
    import anyio
    import mcp_types as types
    from mcp.shared.exceptions import MCPError

    t0 = time.perf_counter()
    try:
        with anyio.fail_after(CALL_LIMIT_S * 3):
            if isinstance(args, dict):
                result = await client.call_tool(name, args)
            else:  # the SDK client refuses to send non-object arguments: the raw request does
                raw = await client.session._dispatcher.send_raw_request(
                    "tools/call", {"name": name, "arguments": args}, None)
                result = types.CallToolResult.model_validate(raw)
    except TimeoutError:
        return f"no answer in {CALL_LIMIT_S * 3:g} s", time.perf_counter() - t0
    except MCPError as exc:
        code = getattr(getattr(exc, "error", None), "code", None)
        return (f"JSON-RPC {code}: {exc}" if code == -32603 else None), time.perf_counter() - t0
    except ValueError as exc:  # the client itself could not send it (serialization depth): not an input
        raise NotSent(str(exc)) from None
    LAST["is_error"] = bool(result.is_error)
    return internal_failure(result), time.perf_counter() - t0


LAST: dict[str, bool] = {}


class NotSent(Exception):
    pass


def _vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of a live process (VmHWM), MB."""
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _server_pid() -> int:
    from moe_overlap.mcp.jobs import descendant_pids

    for pid in descendant_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"moe_overlap.server" in f.read():
                    return pid
        except OSError:
            continue
    raise RuntimeError("the server process is gone")


def fuzz(examples: int, seed_value: int):
    """At least `examples` calls spread over every tool, sent to a `moe-overlap-mcp` stdio server process
    (`--max-jobs 0`); a Tally (tally.py) of what went wrong, with the server's peak RSS."""
    import sys

    from anyio.from_thread import start_blocking_portal
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from benchmarks.fuzz.fuzz_exec import ROOT, Outcome
    from benchmarks.fuzz.tally import Tally

    tally = Tally("mcp")
    folder = make_allowed_folder()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    params = StdioServerParameters(command=sys.executable, args=[
        "-m", "moe_overlap.server", "--allowed-dir", str(folder), "--runs-dir", str(folder / "runs"),
        "--max-jobs", "0"], env=env, cwd=str(ROOT))
    per_tool: dict[str, dict[str, int]] = {}
    tally.per_tool = per_tool  # type: ignore[attr-defined]  # what each tool answered (reported in fuzz.json)
    with start_blocking_portal() as portal, portal.wrap_async_context_manager(Client(params)) as client:
        async def schemas():
            return {t.name: t.input_schema for t in (await client.list_tools()).tools}

        tools = portal.call(schemas)
        per_round = 2 * len(tools)

        @seed(seed_value)
        @settings(max_examples=-(-examples // per_round) + 2, deadline=None, database=None,
                  phases=[Phase.generate], suppress_health_check=list(HealthCheck))
        @given(st.tuples(tool_calls(tools), tool_calls(tools)))
        def body(two_rounds):
            for name, args in [*two_rounds[0], *two_rounds[1]]:
                LAST.clear()
                try:
                    problem, seconds = portal.call(call, client, name, args)
                except NotSent:
                    continue
                kind = "protocol error" if not LAST else "tool error" if LAST["is_error"] else "result"
                per_tool.setdefault(name, {}).setdefault(kind, 0)
                per_tool[name][kind] += 1
                tally.add(f"{name} {str(args)[:300]}", Outcome(0 if problem is None else 1, "{}", "", seconds),
                          json_expected=False, problem=problem)

        body()
        tally.handler_peak_rss_mb = round(_vm_hwm_mb(_server_pid()), 1)  # type: ignore[attr-defined]
    return tally
