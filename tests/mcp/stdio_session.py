"""A raw stdio JSON-RPC session with `python -m moe_overlap.server`, keeping every byte of stdout.

Used by the stdio test and the start-up benchmark. Raw pipes rather than the SDK client, so the test sees
exactly what the server wrote on stdout (the SDK client would skip a non-JSON line with a log message).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def initialize_request(request_id: int = 1, version: str = "2025-11-25") -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize",
            "params": {"protocolVersion": version, "capabilities": {},
                       "clientInfo": {"name": "moe-overlap-tests", "version": "0"}}}


class StdioSession:
    def __init__(self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None):
        env = dict(env or os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.started = time.perf_counter()
        self.proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", *args], cwd=cwd or REPO,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=env)
        self.raw_lines: list[bytes] = []
        self._queue: queue.Queue = queue.Queue()
        self._stderr: list[bytes] = []
        self._responses: dict = {}
        threading.Thread(target=self._read_stdout, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr), daemon=True).start()

    def _read_stdout(self) -> None:
        for line in self.proc.stdout:
            self.raw_lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def send(self, message: dict) -> None:
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def wait_for(self, request_id: int, timeout: float = 30.0) -> dict:
        """The response to `request_id` (other messages, e.g. notifications, are skipped but kept)."""
        deadline = time.monotonic() + timeout
        while request_id not in self._responses:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no response to {request_id} in {timeout}s; stderr: {self.stderr()[-2000:]}")
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise EOFError(f"server closed stdout; stderr: {self.stderr()[-2000:]}")
            try:
                message = json.loads(line)
            except ValueError:
                continue  # the caller's stdout check reports it
            if "id" in message and "method" not in message:
                self._responses[message["id"]] = message
        return self._responses.pop(request_id)

    def close(self, timeout: float = 30.0) -> int:
        """Close stdin (the client goes away) and wait for the server to exit."""
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()

    def stderr(self) -> str:
        return b"".join(self._stderr).decode(errors="replace")


def start_http_server(runs_dir: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, str]:
    """`moe-overlap-mcp --transport streamable-http` on a free port: (process, URL), once it accepts connections."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(env or os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", "--transport", "streamable-http",
                             "--port", str(port), "--runs-dir", str(runs_dir)], cwd=REPO, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"http://127.0.0.1:{port}/mcp"
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"server did not start: {proc.stderr.read().decode()[-2000:]}") from None
            time.sleep(0.2)


def no_process_left(token: str, timeout: float = 5.0) -> None:
    """Every process carrying the server's `token` (TOKEN_ENV) is gone within `timeout`."""
    from tests.distributed._verify_util import processes_with_token

    deadline = time.monotonic() + timeout
    while processes_with_token(token) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with_token(token), "processes outlived the server"
