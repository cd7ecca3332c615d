"""Start-up: importing and building the server, and using the knowledge tools, loads no torch.

The time to answer `initialize` is measured by benchmarks/cpu/mcp_startup.py (docs/benchmarks.md), not
asserted here: a shared CI machine makes wall-clock limits flaky. The test checks that the server
answers, with a limit that only catches a hang.
"""

from __future__ import annotations

import json
import subprocess
import sys

from tests.mcp.stdio_session import REPO, StdioSession, initialize_request

HEAVY = ("torch", "megatron", "transformer_engine", "numpy", "matplotlib")

PROBE = r"""
import json, sys
import anyio
from mcp import Client
from moe_overlap.server import ServerOptions, build_server

after_import = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
server = build_server(ServerOptions(allowed_dirs=["examples"]))

async def calls():
    async with Client(server, mode="legacy") as client:
        for name, args in [("list_skills", {}), ("get_skill_card", {"field": "summary"}),
                           ("validate_config", {"config_path": "ep-overlap-minimal.yaml"}),
                           ("check_training_log", {"text": "overlap_moe_expert_parallel_comm: True"}),
                           ("diagnose_failure", {"text": "NCCL timeout in all-to-all"}),
                           ("generate_config", {"ep": 8, "experts": 64}),
                           ("estimate_overlap_benefit", {"hidden": 1024, "moe_ffn": 512, "experts": 8, "topk": 2,
                                                         "tokens": 1024, "ep": 2, "fabric": "h100-nvlink",
                                                         "gpu_preset": "h100"})]:
            result = await client.call_tool(name, args)
            assert not result.is_error, (name, result.content)

anyio.run(calls)
after_calls = sorted(m for m in sys.modules if m.split(".")[0] in HEAVY)
print(json.dumps({"after_import": after_import, "after_calls": after_calls}))
""".replace("HEAVY", repr(HEAVY))


def test_no_torch_at_start_up_nor_in_knowledge_tools():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert loaded == {"after_import": [], "after_calls": []}


def test_answers_initialize():
    session = StdioSession()
    try:
        session.send(initialize_request(1))
        reply = session.wait_for(1, timeout=30)  # a hang guard, not a performance limit
    finally:
        session.close()
    assert reply["result"]["protocolVersion"] == "2025-11-25"
    assert reply["result"]["serverInfo"]["name"] == "moe-overlap"
