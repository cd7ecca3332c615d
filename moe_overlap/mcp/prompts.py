"""The `enable-ep-overlap` prompt: validate -> generate -> verify -> check logs, with the tools by name."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from pydantic import Field

SKILL = "perf-expert-parallel-overlap"


def render(config: str = "", ep: str = "", experts: str = "") -> str:
    where = (f"The user's config is: {config}. Pass it to the tools (a file path as `config_path`, "
             "YAML text as `config_text`)." if config else
             "Ask the user for their training config (a file under the server's allowed folder, YAML text, "
             "or Megatron-LM flags) before step 1.")
    shape = ""
    if ep or experts:
        shape = f" Target layout: expert-parallel size {ep or '?'}, {experts or '?'} experts."
    return f"""You are enabling MoE expert-parallel (EP) communication overlap \
(`overlap_moe_expert_parallel_comm`) for a Megatron training job, using the `{SKILL}` skill.{shape}
{where}

Read `skill://{SKILL}/SKILL.md` first; `get_skill_card` gives single fields of the card.

1. Validate. Call `validate_config` with the config and the target's versions (torch_version, te_version, \
megatron_core_version, gpu). For every finding with severity error, apply its `fix`; quote its rule id to \
the user. Repeat until `valid` is true.
2. Generate. If the config cannot be repaired, or the user starts from scratch, call `generate_config` \
(ep, experts, dispatcher, stage) for a minimal working config; keep delay_wgrad_compute off for the first \
rollout. Validate the result again (step 1).
3. Verify. Call `run_verification` with the config (background=true when the run may exceed about a \
minute; then poll `get_verification_status`). Proceed only if the report's verdict is `passed` (GPU: \
losses match baseline, the overlap runs complete, throughput judged) or `throughput-not-judged` (CPU: \
correctness only; say that speed was not judged, and quote report.analysis.explanation). On any other \
verdict call `diagnose_failure` with report.failure.message or the failing criterion's summary.
4. Check logs. After the user runs the real job, call `check_training_log` on its log (text or a path \
under the allowed folder) to confirm the effective settings and catch failures; call `diagnose_failure` \
on any error it reports.

Report to the user: what changed in the config and why (rule ids), the verification verdict, and what \
to watch in the logs. `estimate_overlap_benefit` predicts the gain for their shape if they ask whether \
it is worth it."""


def register(server: MCPServer) -> None:
    @server.prompt(name="enable-ep-overlap", title="Enable EP communication overlap",
                   description="Walk through validate -> generate -> verify -> check logs for enabling "
                               "MoE expert-parallel communication overlap in a training config.")
    def enable_ep_overlap(
        config: Annotated[str, Field(description="config file path under the allowed folder, or YAML text; "
                                                 "empty: ask the user", max_length=65536)] = "",
        ep: Annotated[str, Field(description="target expert-parallel size, e.g. '8'", max_length=8)] = "",
        experts: Annotated[str, Field(description="number of routed experts, e.g. '64'", max_length=8)] = "",
    ) -> str:
        return render(config, ep, experts)
