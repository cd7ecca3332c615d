"""One stdio session with the server as a subprocess: stdout carries only JSON-RPC, and EOF ends it."""

from __future__ import annotations

import json
import shutil

from moe_overlap import paths
from tests.mcp.stdio_session import StdioSession, initialize_request

SKILL_MD = "skill://perf-expert-parallel-overlap/SKILL.md"


def test_stdio_session_stdout_is_only_json_rpc(tmp_path):
    shutil.copy(paths.examples_dir() / "ep-overlap-minimal.yaml", tmp_path / "config.yaml")
    session = StdioSession("--allowed-dir", str(tmp_path))
    try:
        session.send(initialize_request(1))
        init = session.wait_for(1)
        assert init["result"]["serverInfo"]["name"] == "moe-overlap"
        assert init["result"]["capabilities"]["tools"] is not None
        session.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        session.send({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        session.send({"jsonrpc": "2.0", "id": 3, "method": "resources/read", "params": {"uri": SKILL_MD}})
        session.send({"jsonrpc": "2.0", "id": 4, "method": "tools/call",
                      "params": {"name": "validate_config", "arguments": {"config": "config.yaml"}}})
        session.send({"jsonrpc": "2.0", "id": 5, "method": "tools/call",
                      "params": {"name": "check_training_log", "arguments": {"path": "../x.log"}}})
        session.send({"jsonrpc": "2.0", "id": 6, "method": "prompts/get",
                      "params": {"name": "enable-ep-overlap", "arguments": {}}})
        listing = session.wait_for(2)["result"]
        assert "run_verification" in {t["name"] for t in listing["tools"]}
        assert len(json.dumps(listing, separators=(",", ":"))) < 16_000  # what the client receives
        skill = session.wait_for(3)["result"]["contents"][0]
        assert skill["mimeType"] == "text/markdown" and skill["text"].startswith("---")
        validated = session.wait_for(4, timeout=60)["result"]
        assert validated["isError"] is False and "valid" in validated["structuredContent"]
        assert validated["content"][0]["text"] == json.dumps(validated["structuredContent"], separators=(",", ":"),
                                                             ensure_ascii=False)
        refused = session.wait_for(5)["result"]
        assert refused["isError"] is True and "`path`" in refused["content"][0]["text"]
        assert "validate_config" in json.dumps(session.wait_for(6)["result"])
    finally:
        code = session.close()
    assert code == 0, session.stderr()[-3000:]
    assert session.raw_lines, "no output at all"
    for raw in session.raw_lines:
        message = json.loads(raw)  # every line is one JSON document ...
        assert message.get("jsonrpc") == "2.0", raw  # ... and a JSON-RPC message
        assert "id" in message or "method" in message, raw
