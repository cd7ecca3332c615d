"""Streamable HTTP: one session over a real socket, and DNS-rebinding protection on the default bind."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from moe_overlap.mcp.skills_ext import IDENTIFIER
from tests.mcp.stdio_session import start_http_server


@pytest.fixture
def http_server(tmp_path):
    proc, url = start_http_server(tmp_path)
    yield url
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
