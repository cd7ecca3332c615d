"""Issue 15 over the real transports: answers stay quick next to a hostile call, SIGTERM and a closed stdin end
the server within 2 s in every state (a verification running included), no process outlives it, and bad lines
get JSON-RPC errors."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.distributed._verify_util import TOKEN_ENV, processes_with_token
from tests.mcp.stdio_session import StdioSession, initialize_request, no_process_left, start_http_server

ALIAS_BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]\n" for i in range(8)) + "model: *i\n"
HUGE_ESTIMATE = {"hidden": 4096, "moe_ffn": 2048, "experts": 64, "topk": 8, "tokens": 4096, "ep": 8,
                 "layers": 100_000, "micro_batches": 100_000, "fabric": "h100-nvlink", "gpu_preset": "h100"}
LONG_RUN = {"nproc": 2, "steps": 500, "modes": ["baseline", "overlap"], "timeout_s": 600}


def _call(session: StdioSession, request_id: int, name: str, arguments: dict) -> None:
    session.send({"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                  "params": {"name": name, "arguments": arguments}})




def _ends_within(session: StdioSession, action, seconds: float = 2.0) -> int:
    t0 = time.monotonic()
    action()
    code = session.proc.wait(30)
    elapsed = time.monotonic() - t0
    assert elapsed < seconds, f"the server took {elapsed:.2f} s to end"
    return code


def _wait_for_ranks(session: StdioSession, token: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(pid != session.proc.pid for pid in processes_with_token(token)):
            # the ranks are up once they have opened their records (a rank file exists under runs/)
            return
        time.sleep(0.2)
    raise AssertionError("no rank started")


def test_alias_bomb_and_huge_estimate_leave_the_server_responsive(stdio):
    t0 = time.monotonic()
    _call(stdio, 2, "run_verification", {"config_text": ALIAS_BOMB})
    time.sleep(1.0)
    stdio.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    assert stdio.wait_for(3, timeout=2.0)["result"]["tools"]
    assert time.monotonic() - t0 < 3.0
    refused = stdio.wait_for(2, timeout=2.0)["result"]
    assert refused["isError"] and "anchors and aliases" in refused["content"][0]["text"]
    t0 = time.monotonic()
    _call(stdio, 4, "estimate_overlap_benefit", HUGE_ESTIMATE)
    answer = stdio.wait_for(4, timeout=5.0)
    assert time.monotonic() - t0 < 5.0 and answer["result"]["isError"]


@pytest.mark.parametrize("state", ["idle", "after-alias-bomb", "pending-status-wait"])
def test_sigterm_ends_the_server_within_2_s(stdio, token, state):
    if state == "after-alias-bomb":
        _call(stdio, 2, "run_verification", {"config_text": ALIAS_BOMB})
        time.sleep(1.0)
    elif state == "pending-status-wait":
        _call(stdio, 2, "get_verification_status", {"job_id": "verify-" + "0" * 32, "wait_s": 50})
        time.sleep(0.5)
    assert _ends_within(stdio, lambda: stdio.proc.send_signal(signal.SIGTERM)) == 128 + signal.SIGTERM
    no_process_left(token)


@pytest.mark.parametrize("how", ["sigterm", "close-stdin"])
def test_a_running_verification_does_not_delay_the_end(stdio, token, how):
    _call(stdio, 2, "run_verification", LONG_RUN)  # blocking: the tool call stays pending
    _wait_for_ranks(stdio, token)
    time.sleep(2.0)
    action = (lambda: stdio.proc.send_signal(signal.SIGTERM)) if how == "sigterm" else stdio.proc.stdin.close
    _ends_within(stdio, action)
    no_process_left(token)


def test_close_stdin_with_a_tool_call_pending(stdio, token):
    _call(stdio, 2, "get_verification_status", {"job_id": "verify-" + "0" * 32, "wait_s": 50})
    _call(stdio, 3, "estimate_overlap_benefit", {**HUGE_ESTIMATE, "layers": 1024, "micro_batches": 65536})
    assert _ends_within(stdio, stdio.proc.stdin.close) == 0
    no_process_left(token)


def test_bad_lines_get_json_rpc_errors(stdio):
    stdio.proc.stdin.write(b"this is not json\n")
    stdio.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": '
                           + b'{"a": ' * 300 + b"1" + b"}" * 300 + b"}\n")
    stdio.proc.stdin.write(b"[" * 100_000 + b"]" * 100_000 + b"\n")
    stdio.proc.stdin.write(b'{"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": 5}}\n')
    stdio.proc.stdin.flush()
    stdio.send({"jsonrpc": "2.0", "id": 9, "method": "ping"})
    assert stdio.wait_for(7, timeout=5)["error"]["code"] == -32602
    assert stdio.wait_for(8, timeout=5)["error"]["code"] in (-32602, -32600)
    assert stdio.wait_for(9, timeout=5)["result"] == {}
    errors = [json.loads(x) for x in stdio.raw_lines if b'"id":null' in x]
    assert [e["error"]["code"] for e in errors] == [-32700, -32700]


@pytest.fixture
def http_server(tmp_path, token):
    proc, url = start_http_server(tmp_path / "runs", env={**os.environ, TOKEN_ENV: token})
    yield proc, url
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def _texts(result) -> str:
    return json.dumps([getattr(c, "text", "") for c in result.content]) + json.dumps(result.structured_content)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_http_sessions_own_their_jobs_and_sigterm_ends_a_running_server(http_server, token):
    import anyio
    from mcp import Client

    proc, url = http_server
    async with Client(url, mode="legacy") as a, Client(url, mode="legacy") as b:
        started = await a.call_tool("run_verification", {**LONG_RUN, "background": True})
        assert not started.is_error, _texts(started)
        job_id = started.structured_content["job_id"]
        seen_by_b = []
        for name, args in (("get_verification_status", {"job_id": job_id}),
                           ("cancel_verification", {"job_id": job_id, "wait_s": 1}),
                           ("run_verification", {**LONG_RUN, "background": True}),
                           ("get_verification_status", {"job_id": "verify-" + "0" * 32})):
            result = await b.call_tool(name, args)
            assert result.is_error, (name, _texts(result))
            seen_by_b.append(_texts(result))
        assert not any(job_id in text or job_id[7:] in text for text in seen_by_b), seen_by_b
        assert "no verification job" in seen_by_b[0] and "no verification job" in seen_by_b[1]
        mine = await a.call_tool("get_verification_status", {"job_id": job_id})
        assert not mine.is_error and mine.structured_content["state"] == "running"
        # a hostile call from A: both clients still get tools/list within 2 s
        async with anyio.create_task_group() as tg:
            tg.start_soon(a.call_tool, "run_verification", {"config_text": ALIAS_BOMB})
            await anyio.sleep(1.0)
            for client in (a, b):
                with anyio.fail_after(2.0):
                    assert (await client.list_tools()).tools
        with anyio.fail_after(5.0):
            huge = await b.call_tool("estimate_overlap_benefit", HUGE_ESTIMATE)
        assert huge.is_error
        deadline = time.monotonic() + 90
        while len(processes_with_token(token)) < 2 and time.monotonic() < deadline:  # server + its ranks
            await anyio.sleep(0.2)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await anyio.to_thread.run_sync(proc.wait, 30)
        assert time.monotonic() - t0 < 2.0
    no_process_left(token)


@pytest.mark.parametrize("state", ["idle", "serving"])
def test_http_sigterm_within_2_s(http_server, token, state):
    import urllib.request

    proc, url = http_server
    if state == "serving":  # an open SSE stream (GET) that a graceful shutdown would wait for
        request = urllib.request.Request(url, method="POST", data=json.dumps(initialize_request(1)).encode(),
                                         headers={"Content-Type": "application/json",
                                                  "Accept": "application/json, text/event-stream"})
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    assert time.monotonic() - t0 < 2.0
    no_process_left(token)


def test_abandoned_heavy_calls_do_not_starve_the_server(stdio):
    """60 of the largest estimates, each abandoned (notifications/cancelled) at once: every tool call is bounded
    and tool work has a pool of its own, so the server catches up within seconds (the 40 abandoned estimates of
    issue 15 held their threads for hours) and then serves a new call as usual."""
    big = {**HUGE_ESTIMATE, "layers": 1024, "micro_batches": 65536}
    for i in range(100, 160):
        _call(stdio, i, "estimate_overlap_benefit", big)
        stdio.send({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": i}})
    stdio.send({"jsonrpc": "2.0", "id": 2, "method": "ping"})
    stdio.wait_for(2, timeout=15)
    t0 = time.monotonic()
    _call(stdio, 3, "validate_config", {"config_text": "model:\n  expert_model_parallel_size: 8\n"})
    assert "result" in stdio.wait_for(3, timeout=10)
    assert time.monotonic() - t0 < 5
    answered = {json.loads(line).get("id") for line in stdio.raw_lines}
    assert not answered & set(range(100, 160)), "an abandoned call was answered"
