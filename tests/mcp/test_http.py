"""Streamable HTTP: one session over a real socket, and DNS-rebinding protection on the default bind."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from moe_overlap.mcp.skills_ext import IDENTIFIER
from tests.mcp.stdio_session import REPO


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def http_server(tmp_path):
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", "--transport", "streamable-http",
                             "--port", str(port), "--runs-dir", str(tmp_path)], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"server did not start: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(30)


def _post(url: str, headers: dict[str, str]) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"}).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "Accept": "application/json, text/event-stream", **headers})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_http_session_and_rebinding_protection(http_server):
    from mcp import Client

    async with Client(http_server) as client:
        assert client.protocol_version == "2026-07-28"
        assert IDENTIFIER in (client.server_capabilities.extensions or {})
        names = {t.name for t in (await client.list_tools()).tools}
        assert "run_verification" in names
        listed = await client.call_tool("list_skills", {})
        assert not listed.is_error
    async with Client(http_server, mode="legacy") as client:
        assert client.protocol_version == "2025-11-25"
    port = http_server.split(":")[2].split("/")[0]
    assert _post(http_server, {"Host": "evil.example"}) == 421
    assert _post(http_server, {"Host": f"127.0.0.1:{port}", "Origin": "http://evil.example"}) == 403
