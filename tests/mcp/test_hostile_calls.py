"""Issue 34 over the real transports: a hostile diagnose text (the matcher's worst case, inside the 64 KiB cap)
runs in a worker process, so `tools/list` answers within 2 s beside it and SIGTERM ends the server within 2 s;
a call with an integer over 4300 digits is answered with its own id (stdio and HTTP)."""

from __future__ import annotations

import http.client
import json
import os
import signal
import time
import urllib.request

from tests.distributed._verify_util import TOKEN_ENV
from tests.mcp.stdio_session import StdioSession, initialize_request, no_process_left, start_http_server

HOSTILE_TEXT = ("deepep none " * 6000)[:60000]  # 29 s for 8 KB with the backtracking matcher (issue 34)
BIG = "9" * 5000




def _raw(session: StdioSession, line: str) -> None:
    session.proc.stdin.write(line.encode() + b"\n")
    session.proc.stdin.flush()


def test_stdio_hostile_diagnose_leaves_tools_list_and_sigterm_quick(stdio, token):
    stdio.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                "params": {"name": "diagnose_failure", "arguments": {"text": HOSTILE_TEXT}}})
    time.sleep(3.0)  # the match is well under way
    t0 = time.monotonic()
    stdio.send({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    assert stdio.wait_for(3, timeout=10)["result"]["tools"]
    assert time.monotonic() - t0 < 2.0
    t0 = time.monotonic()
    stdio.proc.send_signal(signal.SIGTERM)
    stdio.proc.wait(30)
    assert time.monotonic() - t0 < 2.0
    no_process_left(token)


def test_stdio_long_integer_is_answered_with_its_id(stdio):
    _raw(stdio, '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"estimate_overlap_benefit",'
                f'"arguments":{{"hidden":{BIG},"tokens":1,"ep":2}}}}}}')
    answer = stdio.wait_for(7, timeout=10)
    assert answer["error"]["code"] == -32602 and "digits" in answer["error"]["message"]
    _raw(stdio, f'{{"jsonrpc":"2.0","method":"notifications/progress","params":{{"progress":{BIG}}}}}')
    stdio.send({"jsonrpc": "2.0", "id": 8, "method": "ping"})
    assert "result" in stdio.wait_for(8, timeout=10)
    assert all(json.loads(line).get("id") in (1, 7, 8) for line in stdio.raw_lines), "a notification was answered"


def _post(url: str, body: bytes, session_id: str | None = None) -> tuple[dict, str | None]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if session_id:
        headers["mcp-session-id"] = session_id
    with urllib.request.urlopen(urllib.request.Request(url, method="POST", data=body, headers=headers),
                                timeout=30) as response:
        text = response.read().decode()
        sid = response.headers.get("mcp-session-id")
    data = [line[5:] for line in text.splitlines() if line.startswith("data:")] or [text]
    return json.loads(data[-1]), sid


def _post_quietly(url: str, body: bytes, session_id: str) -> None:
    try:
        _post(url, body, session_id)
    except (OSError, http.client.HTTPException):
        pass  # the server was ended under it: that is the test


def test_http_long_integer_and_hostile_diagnose(tmp_path, token):
    import threading

    proc, url = start_http_server(tmp_path / "runs", env={**os.environ, TOKEN_ENV: token})
    try:
        _, a = _post(url, json.dumps(initialize_request(1)).encode())
        _, b = _post(url, json.dumps(initialize_request(1)).encode())
        for sid in (a, b):
            headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                       "mcp-session-id": sid}
            urllib.request.urlopen(urllib.request.Request(url, method="POST", headers=headers, data=json.dumps(
                {"jsonrpc": "2.0", "method": "notifications/initialized"}).encode()), timeout=30).close()
        body = ('{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"estimate_overlap_benefit",'
                f'"arguments":{{"hidden":{BIG}}}}}}}').encode()
        answer, _ = _post(url, body, a)
        assert answer["id"] == 5 and answer["error"]["code"] == -32602
        hostile = json.dumps({"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {
            "name": "diagnose_failure", "arguments": {"text": HOSTILE_TEXT}}}).encode()
        threading.Thread(target=_post_quietly, args=(url, hostile, a), daemon=True).start()
        time.sleep(3.0)
        t0 = time.monotonic()
        listed, _ = _post(url, json.dumps({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}).encode(), b)
        assert listed["result"]["tools"] and time.monotonic() - t0 < 2.0
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
        assert time.monotonic() - t0 < 2.0
        no_process_left(token)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
