"""Bad input to every tool gives an isError result whose message names the field and the fix."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from moe_overlap.mcp.safety import MAX_CONFIG_CHARS
from tests.mcp.conftest import PROTOCOL_MODES, connect, text_of

pytestmark = pytest.mark.anyio

# (tool, arguments, field the message must name in backticks, other words it must contain)
CASES = [
    ("list_skills", {"verbose": True}, "verbose", ["unknown argument", "Fix"]),
    ("get_skill_card", {"name": "no-such-skill"}, "name", ["perf-expert-parallel-overlap"]),
    ("get_skill_card", {"field": "constraints.no-such-rule"}, "field", ["ep-size-gt-1"]),
    ("get_skill_card", {"name": 42}, "name", ["Fix"]),
    ("validate_config", {}, "(arguments)", ["give the config in `config`", "argv"]),
    ("validate_config", {"config": {}, "config_text": "model: {}"}, "(arguments)", ["give the config"]),
    ("validate_config", {"config": "../../etc/passwd.yaml"}, "config", ["'..'", "Fix"]),
    ("validate_config", {"config": "/etc/passwd"}, "config", [".yaml, .yml or .json", "Fix"]),
    ("validate_config", {"config": "/etc/missing.yaml"}, "config", ["outside the allowed", "Fix"]),
    ("validate_config", {"config": "missing.yaml"}, "config", ["no such file", "Fix"]),
    ("validate_config", {"config": "model: [1,\n"}, "config", ["YAML syntax error at line", "Fix"]),
    ("validate_config", {"config": "{\n" + "x" * MAX_CONFIG_CHARS}, "config", ["the limit is", "Fix"]),
    ("validate_config", {"config_path": "/etc/passwd"}, "config_path", ["outside the allowed", "Fix"]),
    ("validate_config", {"config_text": "/etc/passwd"}, "config_text", ["Fix"]),
    ("validate_config", {"config_text": "x" * (MAX_CONFIG_CHARS + 1)}, "config_text", ["at most", "Fix"]),
    ("validate_config", {"config": "config.yaml", "gpu": "Voodoo5"}, "gpu", ["H100", "compute capability"]),
    ("validate_config", {"config": {"model": {"bf16": "maybe"}}}, "model.bf16", ["Fix"]),
    ("validate_config", {"config_path": "config.yaml", "overrides": ["x"] * 65}, "overrides", ["Fix"]),
    ("generate_config", {"no_such_option": 1}, "no_such_option", ["unknown argument"]),
    ("generate_config", {"preset": "llama-moe", "gpus": 8}, "preset", ["qwen3-30b-a3b", "Fix"]),
    ("get_skill_card", {"section": "rules"}, "section", ["constraints", "Fix"]),
    ("run_verification", {"nproc": 99}, "nproc", ["less than or equal to 8", "Fix"]),
    ("run_verification", {"modes": ["fast"]}, "modes.0", ["baseline", "Fix"]),
    ("run_verification", {"command": "rm -rf /"}, "command", ["unknown argument"]),
    ("run_verification", {"config": {}, "config_path": "config.yaml"}, "(arguments)", ["once"]),
    ("run_verification", {"config": "/etc/hostname.yaml"}, "config", ["outside the allowed"]),
    ("run_verification", {"timeout_s": 1e9}, "timeout_s", ["Fix"]),
    ("get_verification_status", {"job_id": "verify-nope"}, "job_id", ["no verification job", "Fix"]),
    ("get_verification_status", {}, "job_id", ["required", "Fix"]),
    ("get_verification_status", {"job_id": "x", "wait_s": 3600}, "wait_s", ["less than or equal to 50"]),
    ("cancel_verification", {"job_id": "verify-nope"}, "job_id", ["no verification job", "Fix"]),
    ("cancel_verification", {"job_id": "x", "wait_s": -1}, "wait_s", ["Fix"]),
    ("check_training_log", {}, "(arguments)", ["exactly one of", "path"]),
    ("check_training_log", {"path": "/etc/passwd"}, "path", ["outside the allowed", "Fix"]),
    ("check_training_log", {"path": "."}, "path", ["not a regular file", "Fix"]),
    ("diagnose_failure", {"text": ""}, "text", ["at least 1", "Fix"]),
    ("diagnose_failure", {"text": "NCCL error", "limit": 500}, "limit", ["Fix"]),
    ("estimate_overlap_benefit", {"hidden": -1, "moe_ffn": 1, "experts": 8, "topk": 2, "tokens": 8, "ep": 2},
     "hidden", ["greater than 0", "Fix"]),
    ("estimate_overlap_benefit", {"hidden": 64, "moe_ffn": 64, "experts": 8, "topk": 2, "tokens": 64, "ep": 4,
                                  "fabric": "nvlink"}, "fabric", ["h100-nvlink+ib-400g", "Fix"]),
    ("estimate_overlap_benefit", {"hidden": 64, "moe_ffn": 64, "experts": 6, "topk": 2, "tokens": 64, "ep": 4,
                                  "fabric": "h100-nvlink", "gpu_preset": "h100"}, "ep", ["divide", "Fix"]),
]


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
@pytest.mark.parametrize("tool,args,field,words", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
async def test_bad_input_is_error_with_field_and_fix(server, tool, args, field, words, mode):
    async with connect(server, mode) as client:
        result = await client.call_tool(tool, args)
    message = text_of(result)
    assert result.is_error, f"{tool}({args}) should fail: {message[:300]}"
    assert f"`{field}`" in message, message
    for word in words:
        assert word in message, f"{word!r} missing from: {message}"
    assert "Traceback" not in message


def test_every_tool_has_a_bad_input_case():
    from tests.mcp.test_server_inprocess import TOOLS

    assert {c[0] for c in CASES} == TOOLS


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_symlink_escape_refused(server, allowed_dir: Path, tmp_path: Path, mode):
    outside = tmp_path / "secret.log"
    outside.write_text("overlap_moe_expert_parallel_comm: True\n")
    os.symlink(outside, allowed_dir / "link.log")
    async with connect(server, mode) as client:
        result = await client.call_tool("check_training_log", {"path": "link.log"})
        assert result.is_error and "symbolic link" in text_of(result)
        # The same file copied inside the allowed folder is read.
        (allowed_dir / "real.log").write_text(outside.read_text())
        ok = await client.call_tool("check_training_log", {"path": "real.log"})
        assert not ok.is_error, text_of(ok)


async def test_unknown_tool_is_error(server):
    async with connect(server, "2026-07-28") as client:
        result = await client.call_tool("run_shell", {"cmd": "id"})
    assert result.is_error and "run_shell" in text_of(result)
