"""The `enable-ep-overlap` prompt: validate -> generate -> verify -> check logs, with the tools by name.

Prompt arguments travel as strings; `EnableOverlapArgs` gives them their types (`ep` and `experts` are
integers), and `toolkit.ArgumentGuard` answers a bad one, or an unknown prompt, with JSON-RPC -32602
naming the argument and the fix, before the SDK would turn it into a generic error.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import BaseModel, ConfigDict, Field

from moe_overlap.mcp.toolkit import ArgumentGuard

SKILL = "perf-expert-parallel-overlap"
NAME = "enable-ep-overlap"


class EnableOverlapArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config: str = Field("", max_length=65536, description="config file path in an allowed folder, or YAML "
                                                          "text; empty: ask the user")
    ep: int | None = Field(None, ge=1, le=4096, description="target expert-parallel size: an integer, e.g. 8")
    experts: int | None = Field(None, ge=1, le=4096, description="routed experts per MoE layer: an integer, "
                                                                 "e.g. 64")


def render(config: str = "", ep: int | None = None, experts: int | None = None) -> str:
    where = (f"The user's config is: {config}. Pass it to the tools as `config` (a file path or the YAML "
             "text as it is)." if config else
             "Ask the user for their training config (a file under the server's allowed folder, YAML text, "
             "or Megatron-LM flags) before step 1.")
    shape = ""
    if ep or experts:
        shape = f" Target layout: expert-parallel size {ep or '?'}, {experts or '?'} experts."
    return f"""You are enabling MoE expert-parallel (EP) communication overlap \
(`overlap_moe_expert_parallel_comm`) for a Megatron training job, using the `{SKILL}` skill.{shape}
{where}

Read `skill://{SKILL}/SKILL.md` first; `get_skill_card` gives the card's contents, then one section or field.

1. Validate. Call `validate_config` with the config and the target's versions (torch_version, te_version, \
megatron_core_version, gpu). For every finding with severity error, apply its `fix`; quote its rule id to \
the user. Repeat until `valid` is true.
2. Generate. If the config cannot be repaired, or the user starts from scratch, call `generate_config` \
(ep, experts, dispatcher, stage) for a minimal working config; keep delay_wgrad_compute off for the first \
rollout. Validate the result again (step 1).
3. Verify. Call `run_verification` with the config (background=true when the run may exceed about a \
minute; then poll `get_verification_status`). Proceed only if the summary's verdict is `passed` (GPU: \
losses match baseline, the overlap runs complete, throughput judged) or `throughput-not-judged` (CPU: \
correctness only; say that speed was not judged). On any other \
verdict call `diagnose_failure` with the failure or the failing criterion's summary (the full report is \
the resource in `report_uri`).
4. Check logs. After the user runs the real job, call `check_training_log` on its log (text or a path \
under the allowed folder) to confirm the effective settings and catch failures; call `diagnose_failure` \
on any error it reports.

Report to the user: what changed in the config and why (rule ids), the verification verdict, and what \
to watch in the logs. `estimate_overlap_benefit` predicts the gain for their shape if they ask whether \
it is worth it."""


_FIELDS = EnableOverlapArgs.model_fields


def enable_ep_overlap(
    config: Annotated[str, Field(description=_FIELDS["config"].description)] = "",
    ep: Annotated[int | None, Field(description=_FIELDS["ep"].description)] = None,
    experts: Annotated[int | None, Field(description=_FIELDS["experts"].description)] = None,
) -> str:
    args = EnableOverlapArgs(config=config, ep=ep, experts=experts)  # the same checks when called without the guard
    return render(args.config, args.ep, args.experts)


def register(server: MCPServer, guard: ArgumentGuard) -> None:
    guard.prompts[NAME] = EnableOverlapArgs
    server.prompt(name=NAME, title="Enable EP communication overlap",
                  description="Walk through validate -> generate -> verify -> check logs for enabling "
                              "MoE expert-parallel communication overlap in a training config.")(enable_ep_overlap)
