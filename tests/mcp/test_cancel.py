"""Cancelling a verification, or losing the client, leaves no child process (checked in /proc)."""

from __future__ import annotations

import json
import signal
import time

import anyio
import pytest

from moe_overlap.mcp.jobs import descendant_pids
from tests.mcp.conftest import connect, text_of
from tests.mcp.stdio_session import StdioSession, initialize_request

# Long enough that the run is still going when we cancel it; the cancel ends it within seconds.
LONG_RUN = {"nproc": 2, "steps": 500, "modes": ["baseline", "overlap"], "timeout_s": 600}


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _ranks(pid: int | None = None) -> list[int]:
    """Live verification rank processes under `pid` (default: this test process)."""
    out = []
    for child in descendant_pids(pid):
        try:
            with open(f"/proc/{child}/cmdline", "rb") as fh:
                if b"moe_overlap.verify.run.worker" in fh.read():
                    out.append(child)
        except OSError:
            pass
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.anyio
async def test_cancel_verification_kills_every_rank(server):
    async with connect(server, "legacy") as client:
        started = await client.call_tool("run_verification", {**LONG_RUN, "background": True})
        assert not started.is_error, text_of(started)
        job_id = started.structured_content["job_id"]
        # The launcher starts the ranks one after the other: wait for both.
        ranks = await anyio.to_thread.run_sync(lambda: _wait_for(lambda: len(_ranks()) >= 2 and _ranks(), 60,
                                                                 "rank processes"))
        assert len(ranks) >= 2
        status = await client.call_tool("get_verification_status", {"job_id": job_id, "wait_s": 0.5})
        assert status.structured_content["state"] == "running"  # still running after waiting 0.5 s
        cancelled = await client.call_tool("cancel_verification", {"job_id": job_id, "wait_s": 60})
    result = cancelled.structured_content
    assert result["state"] == "cancelled", result
    assert result["live_child_processes"] == []
    assert result["summary"]["verdict"] == "cancelled"
    assert not [p for p in ranks if _alive(p)]


@pytest.mark.anyio
async def test_client_gone_during_blocking_run_kills_every_rank(server):
    ranks: list[int] = []
    async with connect(server, "legacy") as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.call_tool, "run_verification", LONG_RUN)
            ranks = await anyio.to_thread.run_sync(lambda: _wait_for(_ranks, 60, "rank processes"))
            tg.cancel_scope.cancel()  # the request is abandoned, then the client disconnects
    assert ranks
    await anyio.to_thread.run_sync(lambda: _wait_for(lambda: not _ranks(), 30, "ranks to exit"))
    assert not [p for p in ranks if _alive(p)]


@pytest.mark.parametrize("how", ["close-stdin", "sigterm"])
def test_stdio_client_gone_ends_the_run(tmp_path, how):
    session = StdioSession("--runs-dir", str(tmp_path))
    try:
        session.send(initialize_request(1))
        session.wait_for(1)
        session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "run_verification", "arguments": {**LONG_RUN, "background": True}}})
        reply = session.wait_for(2, timeout=60)
        assert reply["result"]["isError"] is False, reply
        ranks = _wait_for(lambda: _ranks(session.proc.pid), 60, "rank processes")
        if how == "sigterm":
            session.proc.send_signal(signal.SIGTERM)
            assert session.proc.wait(60) == 128 + signal.SIGTERM
    finally:
        code = session.close(timeout=60)
    if how == "close-stdin":
        assert code == 0, session.stderr()[-3000:]
    _wait_for(lambda: not [p for p in ranks if _alive(p)], 10, "ranks to exit")
    # The ranks inherited the server's stdout descriptor: what they print must not reach the wire.
    assert all(json.loads(raw).get("jsonrpc") == "2.0" for raw in session.raw_lines)
