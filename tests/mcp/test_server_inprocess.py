"""The server driven in process with `mcp.Client`, under both protocol generations the SDK offers."""

from __future__ import annotations

import hashlib
import json

import pytest
from mcp.shared.exceptions import MCPError

from moe_overlap import paths
from moe_overlap.jsonout import compact_json
from moe_overlap.mcp.skills_ext import (
    IDENTIFIER,
    GetSkillParams,
    GetSkillRequest,
    GetSkillResult,
    ListSkillsRequest,
    ListSkillsResult,
)
from moe_overlap.mcp.wording import flags_as_arguments
from tests.mcp.conftest import PROTOCOL_MODES, connect, text_of

pytestmark = pytest.mark.anyio
SKILL = "perf-expert-parallel-overlap"
TOOLS = {"list_skills", "get_skill_card", "validate_config", "generate_config", "run_verification",
         "get_verification_status", "cancel_verification", "check_training_log", "diagnose_failure",
         "estimate_overlap_benefit"}
READ_ONLY_TOOLS = TOOLS - {"run_verification", "cancel_verification"}


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_handshake_and_tool_listing(server, mode):
    async with connect(server, mode) as client:
        assert client.protocol_version == ("2025-11-25" if mode == "legacy" else mode)
        tools = {t.name: t for t in (await client.list_tools()).tools}
    assert set(tools) == TOOLS
    for name, tool in tools.items():
        hints = tool.annotations
        assert hints is not None, name
        flags = (hints.read_only_hint, hints.destructive_hint, hints.idempotent_hint, hints.open_world_hint)
        assert None not in flags, f"{name}: every hint set explicitly"
        assert hints.read_only_hint is (name in READ_ONLY_TOOLS), name
        assert hints.open_world_hint is False, name
        assert tool.output_schema and tool.output_schema.get("type") == "object", name
        assert tool.description, name
        for prop, schema in tool.input_schema.get("properties", {}).items():
            assert schema.get("description"), f"{name}.{prop} has no description"
    assert tools["cancel_verification"].annotations.destructive_hint is True
    assert tools["run_verification"].annotations.idempotent_hint is False


async def test_extension_and_instructions(server):
    caps = server._lowlevel_server.get_capabilities(protocol_version="2026-07-28")
    assert IDENTIFIER in (caps.extensions or {})
    async with connect(server, "legacy") as client:
        assert client.server_info.name == "moe-overlap"
        assert f"skill://{SKILL}/SKILL.md" in client.instructions


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_resources_fixed_order_and_reads(server, mode):
    async with connect(server, mode) as client:
        listed = (await client.list_resources()).resources
        again = (await client.list_resources()).resources
        uris = [str(r.uri) for r in listed]
        assert uris == [str(r.uri) for r in again]
        assert uris[:2] == [f"skill://{SKILL}/SKILL.md", f"skill://{SKILL}/card.yaml"]
        mimes = {str(r.uri): r.mime_type for r in listed}
        assert mimes[uris[0]] == "text/markdown" and mimes[uris[1]] == "application/yaml"
        groups = [u.split("://")[0] + ("/docs" if "/docs/" in u else "/schemas" if "schemas/" in u else "")
                  for u in uris]
        assert groups == sorted(groups, key=["skill", "moe-overlap/docs", "moe-overlap/schemas"].index)
        assert any(u.startswith("moe-overlap://schemas/") for u in uris)
        assert any(u.startswith("moe-overlap://docs/") for u in uris)
        body = (await client.read_resource(uris[0])).contents[0].text
        assert body == (paths.skills_dir() / SKILL / "SKILL.md").read_text(encoding="utf-8")
        for bad in (f"skill://{SKILL}/../../pyproject.toml", "file:///etc/passwd", f"skill://{SKILL}/nope.md"):
            with pytest.raises(MCPError):
                await client.read_resource(bad)


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_skills_list_and_get(server, mode):
    async with connect(server, mode) as client:
        listing = await client.session.send_request(ListSkillsRequest(), ListSkillsResult)
        [skill] = [s for s in listing.skills if s.frontmatter.get("name") == SKILL]
        assert skill.uri == f"skill://{SKILL}/SKILL.md"
        assert skill.resources[0].uri == skill.uri
        for res in skill.resources:
            rel = res.uri.removeprefix(f"skill://{SKILL}/")
            data = (paths.skills_dir() / SKILL / rel).read_bytes()
            assert res.digest == "sha256:" + hashlib.sha256(data).hexdigest() and res.size == len(data)
        got = await client.session.send_request(GetSkillRequest(params=GetSkillParams(uri=skill.uri)), GetSkillResult)
        assert got.skill == skill
        with pytest.raises(MCPError) as err:
            await client.session.send_request(
                GetSkillRequest(params=GetSkillParams(uri="skill://nope/SKILL.md")), GetSkillResult)
        assert err.value.error.code == -32602


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_prompt(server, mode):
    async with connect(server, mode) as client:
        prompts = {p.name: p for p in (await client.list_prompts()).prompts}
        assert "enable-ep-overlap" in prompts
        got = await client.get_prompt("enable-ep-overlap", {"config": "config.yaml", "ep": "8"})
    text = got.messages[0].content.text
    order = [text.index(tool) for tool in ("validate_config", "generate_config", "run_verification",
                                           "check_training_log")]
    assert order == sorted(order) and "config.yaml" in text


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_card_tools(server, mode):
    async with connect(server, mode) as client:
        listed = await client.call_tool("list_skills", {})
        assert not listed.is_error, text_of(listed)
        assert [s["name"] for s in listed.structured_content["skills"]] == [SKILL]
        toc = await client.call_tool("get_skill_card", {})
        sections = {s["section"]: s for s in toc.structured_content["contents"]["sections"]}
        assert "ep-size-gt-1" in sections["constraints"]["entries"] and "value" not in toc.structured_content
        assert "get_skill_card with section=" in toc.structured_content["next_step"]
        part = await client.call_tool("get_skill_card", {"section": "constraints"})
        assert len(part.structured_content["value"]) == sections["constraints"]["items"]
        one = await client.call_tool("get_skill_card", {"field": "constraints.ep-size-gt-1.severity"})
        assert one.structured_content["value"] == "error"
        inside = await client.call_tool("get_skill_card", {"section": "constraints", "field": "ep-size-gt-1.severity"})
        assert inside.structured_content["value"] == "error"


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_estimate(server, mode):
    args = {"hidden": 4096, "moe_ffn": 1536, "experts": 64, "topk": 8, "tokens": 4096, "ep": 8,
            "micro_batches": 4, "fabric": "h100-nvlink+ib-400g", "gpu_preset": "h100"}
    async with connect(server, mode) as client:
        res = await client.call_tool("estimate_overlap_benefit", args)
    assert not res.is_error, text_of(res)
    assert res.structured_content  # validated against the output schema by the client


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_validate_generate_round_trip(server, mode):
    async with connect(server, mode) as client:
        from_file = await client.call_tool("validate_config", {"config_path": "config.yaml", "torch_version": "2.6.0",
                                                                "te_version": "2.7.0"})
        assert not from_file.is_error, text_of(from_file)
        assert from_file.structured_content["valid"] is True
        broken = await client.call_tool("validate_config", {
            "config": {"model": {"expert_model_parallel_size": 1, "num_moe_experts": 8},
                       "comm_overlap": {"overlap_moe_expert_parallel_comm": True}}})
        rules = {f["rule"] for f in broken.structured_content["findings"] if f["severity"] == "error"}
        assert broken.structured_content["valid"] is False and "ep-size-gt-1" in rules
        flags = await client.call_tool("validate_config", {
            "argv": "--expert-model-parallel-size 8 --num-experts 64 --overlap-moe-expert-parallel-comm --bf16 "
                    "--moe-token-dispatcher-type alltoall"})
        assert not flags.is_error, text_of(flags)
        generated = await client.call_tool("generate_config", {"ep": 8, "experts": 64, "stage": "overlap"})
        assert not generated.is_error, text_of(generated)
        assert generated.structured_content["ok"] is True


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_logs_and_diagnosis(server, mode, allowed_dir):
    log = ("overlap_moe_expert_parallel_comm ........ True\nmoe_token_dispatcher_type ....... alltoall\n"
           "Traceback (most recent call last):\nAssertionError: overlap_moe_expert_parallel_comm requires "
           "expert_model_parallel_size > 1\n")
    (allowed_dir / "train.log").write_text(log)
    async with connect(server, mode) as client:
        inline = await client.call_tool("check_training_log", {"text": log})
        from_file = await client.call_tool("check_training_log", {"path": "train.log"})
        assert not inline.is_error and not from_file.is_error, text_of(inline) + text_of(from_file)
        same = {k: v for k, v in inline.structured_content.items() if k != "source"}
        assert same == {k: v for k, v in from_file.structured_content.items() if k != "source"}
        assert inline.structured_content["source"] == "inline text"
        assert from_file.structured_content["source"].endswith("train.log")
        assert "truncated" not in from_file.structured_content  # only set when a large file was read in part
        assert inline.structured_content["effective_config"]["overlap_moe_expert_parallel_comm"] is True
        assert inline.structured_content["ok"] is False  # the traceback is reported
        diag = await client.call_tool("diagnose_failure", {"text": "AssertionError: overlap_moe_expert_parallel_comm "
                                                                   "requires expert_model_parallel_size > 1",
                                                           "limit": 3})
    assert not diag.is_error, text_of(diag)
    matches = diag.structured_content["matches"]
    assert 1 <= len(matches) <= 3 and matches[0]["fix"]


async def test_blocking_verification_reports_progress(server):
    events = []

    async def on_progress(progress, total, message):
        events.append((progress, total, message))

    async with connect(server, "legacy") as client:
        result = await client.call_tool("run_verification", {"nproc": 2, "steps": 3,
                                                              "modes": ["baseline", "overlap"]},
                                        progress_callback=on_progress)
        assert not result.is_error, text_of(result)
        status = result.structured_content
        report = json.loads((await client.read_resource(status["report_uri"])).contents[0].text)
    assert status["state"] == "succeeded" and status["summary"]["verdict"] == "throughput-not-judged", status
    # A summary, not the report: small, compact JSON; the report (every step) is the job's resource.
    assert max(len(text_of(result)), len(compact_json(status))) < 4000, len(text_of(result))
    assert text_of(result) == compact_json(status)
    assert [r["mode"] for r in report["runs"]] == ["baseline", "overlap"]
    assert [len(r["steps"]) for r in report["runs"]] == [3, 3]
    summary = status["summary"]  # verify/judge/summary.py, the same as the CLI's text
    # The CLI's flags in the verify summary read as this tool's arguments: `--steps 4` -> `steps=4`.
    assert summary["verdict"] == "throughput-not-judged"
    assert summary["headline"] == flags_as_arguments(report["summary"], "verify") and "--" not in summary["headline"]
    assert [m["mode"] for m in summary["modes"]] == ["baseline", "overlap"] and summary["modes"][0]["comm_ms"] > 0
    assert summary["modes"][1]["predicted_ratio"] and summary["why"]
    # Progress: steps x modes plus start-up and judging units, growing from the first event to the verdict.
    values = [e[0] for e in events]
    assert all(a < b for a, b in zip(values, values[1:], strict=False)), values
    assert {e[1] for e in events} == {3 + 2 * (1 + 3) + 2}
    assert values[-1] == events[-1][1] and events[-1][2].startswith("verdict:")
    assert values[0] <= 1 and "planned" in events[0][2]
    assert any("step 3/3 of mode overlap" in e[2] for e in events)
    assert any(e[2].startswith("training done; judging") for e in events)
    assert status["progress"]["done"] == status["progress"]["total"]


async def test_background_verification_handle(server):
    async with connect(server, "2026-07-28") as client:
        started = await client.call_tool("run_verification", {"nproc": 2, "steps": 2, "modes": ["baseline", "overlap"],
                                                               "background": True})
        assert not started.is_error, text_of(started)
        handle = started.structured_content
        assert handle["state"] == "running" and "wait_s" in handle["next_step"]
        busy = await client.call_tool("run_verification", {"background": True})
        assert busy.is_error and handle["job_id"] in text_of(busy)  # one run at a time, named
        for _ in range(20):
            status = (await client.call_tool("get_verification_status",
                                             {"job_id": handle["job_id"], "wait_s": 30})).structured_content
            if status["state"] != "running":
                break
    assert status["state"] == "succeeded" and status["summary"]["verdict"] == "throughput-not-judged", status
    assert status["report_uri"] == f"moe-overlap://jobs/{handle['job_id']}/report.json"
