"""Fuzz every MCP tool's arguments through an in-process client (issue 15): no internal error or exception text,
no call over 10 s; the issue's cases are fixed examples. Generators: benchmarks/fuzz/fuzz_mcp.py (>= 3000 calls in
benchmarks/fuzz/fuzz.py, results committed in benchmarks/results/fuzz.json); here a fixed, modest budget."""

from __future__ import annotations

import shutil
import time

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.fuzz import fuzz, fuzz_mcp


@pytest.fixture(scope="module")
def served():
    from mcp import Client

    folder = fuzz_mcp.make_allowed_folder()
    server = fuzz_mcp.build(folder)

    async def schemas():
        async with Client(server) as client:
            return {t.name: t.input_schema for t in (await client.list_tools()).tools}

    yield server, anyio.run(schemas), folder
    server.jobs.shutdown(wait_s=1)
    shutil.rmtree(folder, ignore_errors=True)


def _run(server, calls) -> list[tuple[str, object, str | None, float]]:
    from mcp import Client

    async def go():
        out = []
        async with Client(server) as client:
            for name, args in calls:
                try:
                    problem, seconds = await fuzz_mcp.call(client, name, args)
                except fuzz_mcp.NotSent:
                    continue
                out.append((name, args, problem, seconds))
        return out

    return anyio.run(go)


def test_fuzz_every_tool(served):
    server, tools, _ = served

    @settings(max_examples=12, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one_round(data):
        for name, args, problem, seconds in _run(server, data.draw(fuzz_mcp.tool_calls(tools))):
            assert problem is None, f"{name} {str(args)[:300]}\n{problem}"
            assert seconds < fuzz_mcp.CALL_LIMIT_S, (name, str(args)[:300], seconds)

    one_round()


ALIAS_BOMB = fuzz.fi.ALIAS_BOMB
ISSUE_CALLS = [
    ("run_verification", {"config_text": ALIAS_BOMB}, "anchors and aliases"),
    ("validate_config", {"config_text": ALIAS_BOMB}, "anchors and aliases"),
    ("validate_config", {"config_path": "bomb.yaml"}, "anchors and aliases"),
    ("validate_config", {"config_text": "model: !!int 0x\n"}, "cannot be read"),
    ("validate_config", {"config_text": "model:\n  num_moe_experts: 2024-02-31\n"}, "cannot be read"),
    ("validate_config", {"config_text": "comm_overlap:\n  overlap_moe_expert_paralel_comm: true\n"},
     "one edit away"),
    ("validate_config", {"config_path": "fifo.yaml"}, "not a regular file"),
    ("validate_config", {"config_path": "out.yaml"}, "outside the allowed folders"),
    ("check_training_log", {"path": "fifo.yaml"}, "not a regular file"),
    ("check_training_log", {"text": "overlap_moe_expert_parallel_comm ... " + " " * 40_000 + "x"}, None),
    ("estimate_overlap_benefit", {**fuzz_mcp.GOOD_ARGS["estimate_overlap_benefit"], "layers": 100_000,
                                  "micro_batches": 100_000}, "less than or equal"),
    ("estimate_overlap_benefit", {**fuzz_mcp.GOOD_ARGS["estimate_overlap_benefit"], "tflops": 1e-300},
     "greater than or equal"),
    ("run_verification", {"config": {"model": {"num_moe_experts": 4, "moe_router_topk": "abc"}}}, "moe_router_topk"),
    ("run_verification", {"config": {"format": "moe-overlap", "moe_router_topk": [1, 2]}}, "moe_router_topk"),
]


@pytest.mark.parametrize("name,args,words", ISSUE_CALLS, ids=[f"{c[0]}-{i}" for i, c in enumerate(ISSUE_CALLS)])
def test_issue_cases_over_mcp(served, name, args, words):
    from mcp import Client

    server, _, _ = served

    async def go():
        async with Client(server) as client:
            t0 = time.monotonic()
            result = await client.call_tool(name, args)
            return result, time.monotonic() - t0

    result, seconds = anyio.run(go)
    text = "\n".join(getattr(c, "text", "") for c in result.content)
    assert fuzz_mcp.internal_failure(result) is None, text
    assert seconds < 2.0
    if words is None:
        assert not result.is_error, text
    else:
        assert result.is_error and words in text, text


def test_wire_fuzz_every_request_gets_its_own_id():
    """Issue 34: hand-written lines over the real stdio wire (5000-digit ints, NaN, 1e-320, 3000-deep nesting):
    every request answered with its own id, none an internal error (benchmarks/fuzz/fuzz_mcp_wire.py runs 6000)."""
    from benchmarks.fuzz.fuzz_mcp_wire import run_wire

    tally = run_wire(150, seed=1)
    assert tally["answered_own_id"] == tally["calls"] == 150, tally["examples"]
    assert tally["internal_errors"] == 0 and tally["over_limit"] == 0, tally["examples"]
