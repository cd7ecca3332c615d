"""Shared fixtures of the MCP tests: a server whose allowed folder is a temp dir, a connected client."""

from __future__ import annotations

import shutil
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from moe_overlap import paths
from moe_overlap.server import ServerOptions, build_server

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
