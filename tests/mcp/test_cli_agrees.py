"""`moe-overlap ... --format json` prints what the MCP tool returns for the same job: one model, one spelling.

The only differences allowed are the ones the surfaces need: a result over MCP names MCP tools where the CLI's
names commands (mcp.wording), and a card read's `next_step` says how to read on with that surface.
"""

from __future__ import annotations

import json

import pytest

from moe_overlap.cli import main
from moe_overlap.mcp.wording import reword
from tests.mcp.conftest import connect, text_of

pytestmark = pytest.mark.anyio
SKILL = "perf-expert-parallel-overlap"
ESTIMATE = {"hidden": 1024, "moe_ffn": 512, "experts": 8, "topk": 2, "tokens": 1024, "ep": 2,
            "fabric": "h100-nvlink+ib-400g", "gpu_preset": "h100"}


def _cli(capsys, *argv: str) -> tuple[str, dict]:
    main([*argv, "--format", "json"])
    out = capsys.readouterr().out
    assert out.count("\n") == 1, "one compact JSON document on one line"
    return out.strip(), json.loads(out)


async def test_cli_json_and_mcp_results_are_the_same_model(server, allowed_dir, capsys):
    config = str(allowed_dir / "config.yaml")
    log = allowed_dir / "train.log"
    log.write_text("overlap_moe_expert_parallel_comm ........ True\nAssertionError: boom\n")
    estimate_argv = [f"--{k.replace('_', '-')}={v}" for k, v in ESTIMATE.items()]
    pairs = [
        (("validate", config, "--torch-version", "2.6.0", "--gpu", "H100"),
         ("validate_config", {"config": "config.yaml", "torch_version": "2.6.0", "gpu": "H100"})),
        (("generate", "--ep", "8", "--experts", "64", "--plan", "--torch-version", "2.6.0"),
         ("generate_config", {"ep": 8, "experts": 64, "plan": True, "torch_version": "2.6.0"})),
        (("generate", "--ep", "8", "--experts", "6"), ("generate_config", {"ep": 8, "experts": 6})),
        (("estimate", *estimate_argv), ("estimate_overlap_benefit", ESTIMATE)),
        (("estimate", *estimate_argv, "--sm-margin=8"), ("estimate_overlap_benefit", {**ESTIMATE, "sm_margin": 8})),
        (("diagnose", "xyzzy plugh"), ("diagnose_failure", {"text": "xyzzy plugh"})),
        (("diagnose", "NCCL timeout in the all-to-all"), ("diagnose_failure", {"text": "NCCL timeout in the all-to-all"})),
        (("check-logs", str(log)), ("check_training_log", {"path": "train.log"})),
        (("card",), ("list_skills", {})),
        (("card", SKILL), ("get_skill_card", {})),
        (("card", SKILL, "--section", "commands"), ("get_skill_card", {"section": "commands"})),
        (("card", SKILL, "--field", "constraints.ep-size-gt-1"), ("get_skill_card", {"field": "constraints.ep-size-gt-1"})),
    ]
    async with connect(server, "legacy") as client:
        for argv, (tool, args) in pairs:
            text, cli = _cli(capsys, *argv)
            result = await client.call_tool(tool, args)
            assert not result.is_error, text_of(result)
            mcp = result.structured_content
            assert json.dumps(json.loads(text), separators=(",", ":"), ensure_ascii=False) == text  # compact
            if tool == "get_skill_card":
                assert cli.pop("next_step").startswith(("for one", "for the card")) and mcp.pop("next_step")
            if tool == "check_training_log":
                assert cli.pop("source") == str(log) and mcp.pop("source").endswith("train.log")
            assert reword(cli) == mcp, f"{argv} and {tool}({args}) disagree"
