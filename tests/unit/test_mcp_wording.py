"""mcp.wording: a `moe-overlap` command in a result becomes the MCP tool call doing the same job."""

from __future__ import annotations

import pytest

from moe_overlap.mcp.wording import flags_as_arguments, mcp_wording, reword

CASES = [
    ("run `moe-overlap validate CONFIG` and `moe-overlap check-logs LOG`",
     "call `validate_config(config=<CONFIG>)` and `check_training_log(path=<LOG>)`"),
    ("moe-overlap validate config.yaml passes; the loss matches", 'validate_config(config="config.yaml") passes; the loss matches'),
    ("moe-overlap validate reports ep-size-gt-1.", "validate_config reports ep-size-gt-1."),
    ("moe-overlap generate --ep 8 --experts 64 --to yaml > a.yaml && moe-overlap validate a.yaml --gpu H100",
     'generate_config(ep=8, experts=64, to="yaml"), saved as a.yaml; then validate_config(config="a.yaml", gpu="H100")'),
    ("moe-overlap verify --nproc 2 --modes baseline,overlap --timeout 60",
     'run_verification(nproc=2, modes=["baseline", "overlap"], timeout_s=60.0)'),
    ('moe-overlap diagnose "NCCL timeout" --limit 3', 'diagnose_failure(text="NCCL timeout", limit=3)'),
    ("moe-overlap estimate --hidden 64 --moe-ffn 32 --experts 8 --topk 2 --tokens 64 --ep 2 --link-gbps 50",
     "estimate_overlap_benefit(hidden=64, moe_ffn=32, experts=8, topk=2, tokens=64, ep=2, intra_gbps=50.0, "
     "inter_gbps=50.0)"),
    ("moe-overlap card perf-expert-parallel-overlap --field summary",
     'get_skill_card(name="perf-expert-parallel-overlap", field="summary")'),
    ("moe-overlap card", "list_skills"),
    ("(moe-overlap validate --megatron-core-version).",
     "(validate_config(megatron_core_version=<MEGATRON_CORE_VERSION>))."),
    ("see `moe-overlap verify --help`", "see the input schema of run_verification"),
    # Only the CLI does these: unchanged.
    ("moe-overlap verify --judge OUT", "moe-overlap verify --judge OUT"),
    ("run `moe-overlap verify --print-launch torchrun --out DIR` first",
     "run `moe-overlap verify --print-launch torchrun --out DIR` first"),
    ("moe-overlap estimate --hidden 64 --moe-ffn 32 --experts 8 --topk 2 --tokens 64 --ep 2 --calibrate",
     "moe-overlap estimate --hidden 64 --moe-ffn 32 --experts 8 --topk 2 --tokens 64 --ep 2 --calibrate"),
    ("no command here", "no command here"),
]


@pytest.mark.parametrize("text,expected", CASES)
def test_commands_become_tool_calls(text, expected):
    assert mcp_wording(text) == expected


def test_verify_flags_in_a_verification_text_become_arguments():
    text = "not judged on --device cpu: about 8 steps (--steps 8); GPUs (--device cuda); --fabric emulated-net."
    assert flags_as_arguments(text, "verify") == ('not judged on device="cpu": about 8 steps (steps=8); GPUs '
                                                  '(device="cuda"); fabric="emulated-net".')
    megatron = "--overlap-moe-expert-parallel-comm --expert-model-parallel-size 8"
    assert flags_as_arguments(megatron, "verify") == megatron  # not options of verify: left alone
    cli_only = "re-judge it: moe-overlap verify --judge OUT; or pass --out DIR --max-steps 40"
    assert flags_as_arguments(cli_only, "verify") == cli_only  # options run_verification does not take


def test_reword_reaches_every_string_and_leaves_the_input_alone():
    data = {"a": ["moe-overlap check-logs x.log"], "b": {"c": "moe-overlap card"}, "n": 3}
    assert reword(data) == {"a": ['check_training_log(path="x.log")'], "b": {"c": "list_skills"}, "n": 3}
    assert data["a"] == ["moe-overlap check-logs x.log"]
