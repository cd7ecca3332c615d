"""What the server costs an assistant's context, and how it guides it, measured on the real server.

Sizes are characters of compact JSON; for a tool result, the larger of its text and its structured
content. Limits (issue 16): tools/list < 16,000 (all pages), get_skill_card with no arguments < 8,000;
the blocking run_verification result < 4,000 is checked with the run in test_server_inprocess.py.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from mcp.shared.exceptions import MCPError

from moe_overlap.jsonout import compact_json
from tests.mcp.conftest import PROTOCOL_MODES, connect, text_of

pytestmark = pytest.mark.anyio
TOOLS_LIST_LIMIT = 16_000
CARD_CONTENTS_LIMIT = 8_000
# Arguments that take free text; every other string argument must be an enum (or a oneOf/anyOf of them).
FREE_TEXT = {"config", "argv", "overrides", "torch_version", "te_version", "megatron_core_version", "env", "field",
             "text", "path", "job_id", "gpu"}
# Arguments the server checks against a fixed table: each must be an enum in the schema.
ENUM_LIKE = {
    "estimate_overlap_benefit": ["fabric", "gpu_preset", "precision"],
    "generate_config": ["model", "gpu", "dispatcher", "flex_backend", "precision", "recompute", "stage", "to"],
    "validate_config": ["gpu"],
    "run_verification": ["device", "schedule", "modes", "fabric", "a2a"],
    "get_skill_card": ["name", "section"],
}
# A CLI command where an MCP tool does the job (verify --judge / --print-launch have no tool).
CLI_COMMAND = re.compile(r"moe-overlap (validate|generate|check-logs|diagnose|estimate|card|verify)\b"
                         r"(?! --judge| --print-launch)")
ESTIMATE = {"hidden": 1024, "moe_ffn": 512, "experts": 8, "topk": 2, "tokens": 1024, "ep": 2,
            "fabric": "h100-nvlink+ib-400g", "gpu_preset": "h100"}
CALLS = [
    ("list_skills", {}),
    ("get_skill_card", {}),
    ("get_skill_card", {"section": "commands"}),
    ("get_skill_card", {"section": "failure_modes"}),
    ("get_skill_card", {"section": "constraints"}),
    ("get_skill_card", {"section": "minimal_example"}),
    ("get_skill_card", {"section": "recommended_path"}),
    ("get_skill_card", {"field": "constraints.ep-size-gt-1"}),
    ("validate_config", {"config": "config.yaml", "torch_version": "2.6.0"}),
    ("validate_config", {"config": {"model": {"expert_model_parallel_size": 1, "num_moe_experts": 8},
                                    "comm_overlap": {"overlap_moe_expert_parallel_comm": True,
                                                     "delay_wgrad_compute": True}}}),
    ("validate_config", {"config": "model:\n  expert_model_parallel_size: 4\n  num_moe_experts: 8\n"}),
    ("generate_config", {"ep": 8, "experts": 64, "plan": True, "torch_version": "2.6.0"}),
    ("generate_config", {"ep": 8, "experts": 6}),
    ("generate_config", {"model": "qwen3-30b-a3b", "gpus": 64}),
    ("check_training_log", {"text": "overlap_moe_expert_parallel_comm ..... True\nAssertionError: boom\n"}),
    ("diagnose_failure", {"text": "xyzzy plugh"}),
    ("diagnose_failure", {"text": "NCCL timeout in the all-to-all after enabling overlap"}),
    ("estimate_overlap_benefit", ESTIMATE),
]


async def _all_tools(client) -> tuple[list, int]:
    """Every tool over every page, and the characters of the pages as compact JSON."""
    tools, size, cursor = [], 0, None
    while True:
        page = await client.list_tools(cursor=cursor) if cursor else await client.list_tools()
        size += len(compact_json(page.model_dump(mode="json", by_alias=True, exclude_none=True)))
        tools += page.tools
        cursor = page.next_cursor
        if not cursor:
            return tools, size


def _keywords(schema) -> set[str]:
    """Every keyword used anywhere in a schema (property names are not keywords)."""
    found: set[str] = set()
    if isinstance(schema, dict):
        for key, value in schema.items():
            found.add(key)
            if key == "properties":
                for sub in value.values():
                    found |= _keywords(sub)
            elif isinstance(value, dict | list):
                found |= _keywords(value)
    elif isinstance(schema, list):
        for item in schema:
            found |= _keywords(item)
    return found


def result_size(result) -> int:
    return max(len(text_of(result)), len(compact_json(result.structured_content or {})))


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_tools_list_is_lean_and_its_schemas_valid(server, mode):
    async with connect(server, mode) as client:
        tools, size = await _all_tools(client)
    assert size < TOOLS_LIST_LIMIT, f"tools/list is {size} characters"
    for tool in tools:
        for schema in (tool.input_schema, tool.output_schema):
            jsonschema.Draft202012Validator.check_schema(schema)
            assert not _keywords(schema) & {"title", "$defs"}, tool.name  # titles repeat the names
            assert '{"type": "null"}' not in json.dumps(schema), tool.name  # no nullable wrappers
        assert tool.output_schema["description"].startswith("schema: moe-overlap://schemas/")


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_every_enum_like_argument_is_an_enum(server, mode):
    async with connect(server, mode) as client:
        tools = {t.name: t for t in (await _all_tools(client))[0]}

    def enum_of(prop: dict) -> list | None:
        if "enum" in prop or "const" in prop:
            return prop.get("enum", [prop.get("const")])
        if prop.get("type") == "array":
            return enum_of(prop.get("items", {}))
        for arm in prop.get("anyOf", []) + prop.get("oneOf", []):
            if enum_of(arm):
                return enum_of(arm)
        return None

    for name, args in ENUM_LIKE.items():
        for arg in args:
            assert enum_of(tools[name].input_schema["properties"][arg]), f"{name}.{arg} is not an enum"
    for name, tool in tools.items():
        for arg, prop in tool.input_schema.get("properties", {}).items():
            kinds = {prop.get("type")} | {a.get("type") for a in prop.get("anyOf", []) + prop.get("oneOf", [])}
            if "string" in kinds and arg not in FREE_TEXT:
                assert enum_of(prop), f"{name}.{arg} takes a string but lists no values"


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_config_argument_is_one_of_object_path_text(server, mode):
    async with connect(server, mode) as client:
        tools = {t.name: t for t in (await _all_tools(client))[0]}
        for name in ("validate_config", "run_verification"):
            prop = tools[name].input_schema["properties"]["config"]
            assert [a["type"] for a in prop["oneOf"]] == ["object", "string", "string"] and prop["examples"]
            validator = jsonschema.Draft202012Validator(prop)
            for value in ({"model": {}}, "configs/train.yaml", "model:\n  bf16: true\n", '{"model": {}}'):
                assert validator.is_valid(value), (name, value)
            assert not validator.is_valid("train.txt")
        by_text = await client.call_tool("validate_config", {"config": "model:\n  expert_model_parallel_size: 1\n"})
        by_path = await client.call_tool("validate_config", {"config": "config.yaml"})
        assert not by_text.is_error and not by_path.is_error, text_of(by_text) + text_of(by_path)
        assert by_path.structured_content["valid"] is True


async def test_card_contents_fit(server):
    async with connect(server, "legacy") as client:
        toc = await client.call_tool("get_skill_card", {})
    assert not toc.is_error and result_size(toc) < CARD_CONTENTS_LIMIT, result_size(toc)


async def test_results_are_compact_json_valid_against_their_schemas_and_name_tools(server):
    async with connect(server, "legacy") as client:
        tools = {t.name: t for t in (await _all_tools(client))[0]}
        full = {}
        for tool in tools.values():
            uri = tool.output_schema["description"].removeprefix("schema: ")
            full[tool.name] = json.loads((await client.read_resource(uri)).contents[0].text)
        for name, args in CALLS:
            result = await client.call_tool(name, args)
            assert not result.is_error, (name, text_of(result))
            text, data = text_of(result), result.structured_content
            assert text == compact_json(data), f"{name}: the text is not the structured content as compact JSON"
            jsonschema.validate(data, tools[name].output_schema)
            jsonschema.validate(data, full[name])
            hits = [text[max(0, m.start() - 40):m.end() + 40] for m in CLI_COMMAND.finditer(text)]
            assert not hits, f"{name}({args}) names CLI commands: {hits}"


async def test_result_names_the_tool_to_call(server):
    async with connect(server, "legacy") as client:
        refused = await client.call_tool("generate_config", {"ep": 8, "experts": 6})
        plan = await client.call_tool("generate_config", {"ep": 8, "experts": 64, "plan": True})
        unknown = await client.call_tool("diagnose_failure", {"text": "xyzzy plugh"})
    assert refused.structured_content["refusal"]["nearest_command"].startswith("generate_config(ep=")
    checks = [c["command"] for s in plan.structured_content["stages"] for c in s["checks"]]
    assert any(c.startswith("generate_config(") and "then validate_config(config=" in c for c in checks), checks
    assert any(c.startswith("check_training_log(path=") for c in checks), checks
    assert "call `validate_config(config=<CONFIG>)`" in unknown.structured_content["hint"]


@pytest.mark.parametrize("mode", PROTOCOL_MODES)
async def test_prompt_arguments_are_typed(server, mode):
    async with connect(server, mode) as client:
        [prompt] = [p for p in (await client.list_prompts()).prompts if p.name == "enable-ep-overlap"]
        described = {a.name: a.description for a in prompt.arguments}
        assert "integer" in described["ep"] and "integer" in described["experts"]
        ok = await client.get_prompt("enable-ep-overlap", {"ep": "8", "experts": "64"})
        assert "expert-parallel size 8, 64 experts" in ok.messages[0].content.text
        for name, args, words in [
            ("enable-ep-overlap", {"ep": "eight"}, ["`ep`", "integer", "Fix"]),
            ("enable-ep-overlap", {"ep": "0"}, ["`ep`", "greater than or equal to 1"]),
            ("enable-ep-overlap", {"model": "x"}, ["`model`", "unknown argument", "config, ep, experts"]),
            ("no-such-prompt", {}, ["no-such-prompt", "enable-ep-overlap"]),
        ]:
            with pytest.raises(MCPError) as err:
                await client.get_prompt(name, args)
            assert err.value.error.code == -32602, (name, args, err.value.error)
            for word in words:
                assert word in err.value.error.message, (word, err.value.error.message)


def test_a_verification_result_is_cut_to_fit_whatever_the_run_said():
    from moe_overlap.mcp.results import MAX_STATUS_CHARS, VerificationStatus, fit
    from moe_overlap.verify.judge.summary import CriterionLine, ModeLine, VerificationSummary

    long = "the ranks disagree on the step time because " * 40
    summary = VerificationSummary(
        verdict="failed", headline=long, why=long, what_would_change_it=[long] * 4, prediction=long,
        criteria=[CriterionLine(id=f"c{i}", status="fail", judged=True, summary=long) for i in range(4)],
        modes=[ModeLine(mode=m, step_ms=1.0) for m in ("baseline", "overlap", "overlap+wgrad")])
    status = VerificationStatus(job_id="verify-1-abc", state="succeeded", elapsed_s=1.0, summary=summary,
                                failure=long[:1000], next_step="read the failure")
    fitted = fit(status)
    data = fitted.model_dump(mode="json", exclude_none=True)
    assert len(compact_json(data)) <= MAX_STATUS_CHARS and fitted.cut
    assert fitted.summary.verdict == "failed" and [c.id for c in fitted.summary.criteria] == ["c0", "c1", "c2", "c3"]
    assert fitted.summary.headline.endswith("[...]") and len(fitted.summary.headline) >= 80
    small = VerificationStatus(job_id="j", state="running", elapsed_s=0.1, next_step="wait")
    assert fit(small) == small
