"""How long a 64 KiB `diagnose_failure` text takes over the real MCP transports (stdio and streamable HTTP), and
whether `tools/list` from another HTTP session answers beside it (issue 34: both within 2 s).

    python benchmarks/fuzz/mcp_diagnose_latency.py --out benchmarks/results/mcp_diagnose_latency.json

Each transport: a fresh server; the first call right after `initialize` (`cold`: the server's pre-warmed worker
process may still be starting), then `--repeats` more (`warm`), for each text kind: the matcher's old worst case
(repeated vocabulary) and an upstream-like error repeated to the cap. Over HTTP a second session's `tools/list`
is timed while a 64 KiB call is in flight. Times are wall-clock seconds from sending to the whole answer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CAP = 65536  # the MCP tool's text cap (64 KiB)
TEXTS = {"repeated vocabulary": ("deepep none " * 6000)[:CAP],
         "upstream-like error": ("RuntimeError: DeepEP error: timeout (dispatch CPU) " * 1400)[:CAP]}
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "latency", "version": "0"}}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


def _call(request_id: int, text: str) -> dict:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "diagnose_failure", "arguments": {"text": text}}}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _outcome(answer: dict) -> str:
    result = answer.get("result") or {}
    if "error" in answer or result.get("isError"):
        return "error"
    return str((result.get("structuredContent") or {}).get("verdict"))


def stdio_run(repeats: int) -> list[dict]:
    runs = tempfile.mkdtemp()
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", "--runs-dir", runs], cwd=ROOT, env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)

    def send(msg: dict) -> None:
        proc.stdin.write((json.dumps(msg) + "\n").encode())
        proc.stdin.flush()

    def wait(request_id: int) -> dict:
        while True:
            msg = json.loads(proc.stdout.readline())
            if msg.get("id") == request_id:
                return msg

    rows, i = [], 10
    try:
        send(INIT)
        wait(1)
        send(INITIALIZED)
        for kind, text in TEXTS.items():
            for _ in range(repeats + 1):
                i += 1
                t0 = time.monotonic()
                send(_call(i, text))
                answer = wait(i)
                rows.append({"transport": "stdio", "text": kind, "bytes": len(text.encode()),
                             "call": "cold" if (i == 11) else "warm", "seconds": round(time.monotonic() - t0, 4),
                             "outcome": _outcome(answer)})
    finally:
        proc.kill()
        proc.wait()
    return rows


def _post(url: str, message: dict, session: str | None = None) -> tuple[dict, str | None]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session:
        headers["mcp-session-id"] = session
    request = urllib.request.Request(url, method="POST", data=json.dumps(message).encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=60) as response:
        text = response.read().decode()
        sid = response.headers.get("mcp-session-id")
    data = [line[5:] for line in text.splitlines() if line.startswith("data:")] or [text or "{}"]
    return json.loads(data[-1]), sid


def http_run(repeats: int) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", "--transport", "streamable-http",
                             "--port", str(port), "--runs-dir", tempfile.mkdtemp()], cwd=ROOT, env=_env(),
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/mcp"
    rows, i = [], 10
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        sessions = []
        for _ in range(2):
            _, sid = _post(url, INIT)
            _post(url, INITIALIZED, sid)
            sessions.append(sid)
        a, b = sessions
        for kind, text in TEXTS.items():
            for _ in range(repeats + 1):
                i += 1
                t0 = time.monotonic()
                answer, _ = _post(url, _call(i, text), a)
                rows.append({"transport": "http", "text": kind, "bytes": len(text.encode()),
                             "call": "cold" if i == 11 else "warm", "seconds": round(time.monotonic() - t0, 4),
                             "outcome": _outcome(answer)})
        # tools/list from the second session while a 64 KiB call of the first is in flight
        busy = threading.Thread(target=_post, args=(url, _call(99, TEXTS["repeated vocabulary"]), a), daemon=True)
        busy.start()
        t0 = time.monotonic()
        listed, _ = _post(url, {"jsonrpc": "2.0", "id": 100, "method": "tools/list"}, b)
        rows.append({"transport": "http", "text": "tools/list beside a 64 KiB diagnose", "bytes": 0, "call": "other",
                     "seconds": round(time.monotonic() - t0, 4),
                     "outcome": "tools" if listed.get("result", {}).get("tools") else "error"})
        busy.join(60)
    finally:
        proc.kill()
        proc.wait()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    rows = stdio_run(args.repeats) + http_run(args.repeats)
    doc = {"command": "python benchmarks/fuzz/mcp_diagnose_latency.py" + (f" --out {args.out}" if args.out else ""),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()} ({os.cpu_count()} CPUs, {platform.machine()}), Python "
                      f"{platform.python_version()}", "rows": rows,
           "max_seconds": max(r["seconds"] for r in rows),
           "errors": sum(r["outcome"] == "error" for r in rows)}
    for r in rows:
        print(f"{r['transport']:5} {r['call']:5} {r['text']:38} {r['seconds']:7.3f} s  {r['outcome']}")
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0 if doc["errors"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
