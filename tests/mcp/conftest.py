"""Shared fixtures of the MCP tests: a server whose allowed folder is a temp dir, a connected client."""

from __future__ import annotations

import os
import shutil
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from moe_overlap import paths
from moe_overlap.server import ServerOptions, build_server
from tests.distributed._verify_util import TOKEN_ENV
from tests.mcp.stdio_session import StdioSession, initialize_request

# Both protocol generations the SDK speaks: the initialize handshake (newest handshake revision)
# and the stateless per-request envelope.
PROTOCOL_MODES = ("legacy", "2026-07-28")


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.fixture
def allowed_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "allowed"
    folder.mkdir()
    shutil.copy(paths.examples_dir() / "ep-overlap-minimal.yaml", folder / "config.yaml")
    return folder


@pytest.fixture
def server(allowed_dir: Path, tmp_path: Path):
    srv = build_server(ServerOptions(allowed_dirs=[str(allowed_dir)], runs_dir=str(tmp_path / "runs")))
    yield srv
    srv.jobs.shutdown(wait_s=30)


@asynccontextmanager
async def connect(server, mode: str):
    from mcp import Client

    async with Client(server, mode=mode) as client:
        yield client


def text_of(result) -> str:
    return "\n".join(getattr(c, "text", "") for c in result.content)


@pytest.fixture
def token():
    """A marker in the server's environment, so every process it starts can be found (and must be gone)."""
    return uuid.uuid4().hex


@pytest.fixture
def stdio(tmp_path, token):
    """A real `moe-overlap-mcp` over stdio, initialized, allowed to read tmp_path."""
    session = StdioSession("--runs-dir", str(tmp_path / "runs"), "--allowed-dir", str(tmp_path),
                           env={**os.environ, TOKEN_ENV: token})
    session.send(initialize_request(1))
    session.wait_for(1, timeout=60)
    session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    yield session
    if session.proc.poll() is None:
        session.proc.kill()
        session.proc.wait()
