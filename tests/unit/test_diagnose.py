"""diagnose(): ranks the card's failure modes against error text; every real Megatron-Core EP-overlap
assertion message maps to the right failure mode."""

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from moe_overlap.cli import main
from moe_overlap.skill.card.cards import load_card
from moe_overlap.skill.diagnose.api import diagnose

CASES = [
    ("AssertionError: disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm",
     "shared-expert-overlap-conflict"),
    ("the step time is unchanged after enabling overlap", "no-speedup"),
    ("training hangs at the first step, no error", "old-torch-hang"),
    ("I set moe_flex_dispatcher_backend=deepep but the flex dispatcher is not used", "flex-backend-ignored"),
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", "out-of-memory-after-enabling"),
    ("the loss diverges from the baseline after 200 steps", "loss-diverges-from-baseline"),
    ("WARNING: DeepEP is not supported on this GPU, falling back to alltoall", "flex-unsupported-gpu"),
    ("validate says: error ep-divides-experts", "experts-not-divisible-by-ep"),
]

# Megatron-Core assertion messages (substring) -> the failure mode that must rank first.
CORE_MESSAGES = {
    "hang issue with torch version": "old-torch-hang",
    "virtual_pipeline_model_parallel_size must be specified": "pipeline-without-virtual-stages",
    "only supported with expert model parallelism": "overlap-without-expert-parallelism",
    "alltoall/flex token dispatcher": "unsupported-dispatcher",
    "disable full recomputation": "recompute-conflict",
    "disable recomputation method": "recompute-conflict",
    "recompute_num_layers must be None": "recompute-conflict",
    "only supported with bf16 or fp16": "fp32-precision",
    "disable moe_shared_expert_overlap": "shared-expert-overlap-conflict",
    "MTP layernum only supports 1": "mtp-layers",
    "with MTP layer": "mtp-layers",
    "CUDA graph scope on moe and mlp": "cuda-graph-scope-includes-moe",
    "must be enabled when enabling delay_wgrad_compute": "delayed-wgrad-without-overlap",
    "legacy groupedgemm": "delayed-wgrad-legacy-grouped-gemm",
    "required for delay_wgrad_compute": "delayed-wgrad-te-version",
    "must be enabled when enabling ep_overlap_early_attn_memory_release": None,  # not an EP-overlap misuse
}


@pytest.mark.parametrize("text,expected", CASES, ids=[c[1] for c in CASES])
def test_top_match(text, expected):
    result = diagnose(text)
    assert result.matches and result.matches[0].failure_mode == expected, [m.failure_mode for m in result.matches]
    top = result.matches[0]
    fm = next(f for f in load_card().failure_modes if f.name == expected)
    assert (top.symptom, top.likely_cause, top.how_to_confirm, top.fix, top.rule_ids) == (
        fm.symptom, fm.likely_cause, fm.how_to_confirm, fm.fix, fm.rule_ids)
    assert 0 < top.score < 1 and top.matched


def test_scores_are_ranked_and_limited():
    result = diagnose("AssertionError: disable full recomputation when enabling overlap_moe_expert_parallel_comm",
                      limit=3)
    assert 1 <= len(result.matches) <= 3
    scores = [m.score for m in result.matches]
    assert scores == sorted(scores, reverse=True)
    assert set(result.matches[0].rule_ids) >= {"no-full-recompute"}


def test_unrelated_text_gives_no_match_and_a_hint():
    result = diagnose("the coffee machine is broken")
    assert result.matches == [] and "moe-overlap validate" in result.hint


def test_rule_id_in_text_finds_its_failure_mode():
    for fm in load_card().failure_modes:
        for rid in fm.rule_ids:
            names = [m.failure_mode for m in diagnose(f"finding {rid}", limit=10).matches]
            assert fm.name in names, (rid, names)


def test_empty_text_rejected():
    with pytest.raises(ValueError):
        diagnose("   ")
    with pytest.raises(ValueError):
        diagnose("x", limit=0)


def _core_assert_messages() -> list[str]:
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core not installed")
    source = Path(next(iter(spec.submodule_search_locations))) / "transformer" / "transformer_config.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    messages = []
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Attribute) and node.test.attr in (
                "overlap_moe_expert_parallel_comm", "delay_wgrad_compute"):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assert) and isinstance(sub.msg, ast.Constant) and isinstance(sub.msg.value, str):
                    messages.append(sub.msg.value)
    return sorted(set(messages))


def test_every_megatron_core_overlap_assertion_is_diagnosed():
    messages = _core_assert_messages()
    assert len(messages) >= 10, messages
    for msg in messages:
        keys = [k for k in CORE_MESSAGES if k in msg]
        assert keys, f"new Megatron-Core message with no failure mode: {msg!r}"
        expected = CORE_MESSAGES[keys[0]]
        if expected is None:
            continue
        top = diagnose(f"AssertionError: {msg}").matches
        assert top and top[0].failure_mode == expected, (msg, [m.failure_mode for m in top])


def test_cli_json(capsys):
    code = main(["diagnose", "AssertionError: overlap_moe_expert_parallel_comm is only supported with bf16 or fp16 "
                 "model", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["matches"][0]["failure_mode"] == "fp32-precision"
    assert out["matches"][0]["rule_ids"] == ["precision-bf16-or-fp16"]


def test_cli_text(capsys):
    assert main(["diagnose", "CUDA_DEVICE_MAX_CONNECTIONS=1 and no speedup"]) == 0
    out = capsys.readouterr().out
    assert "no-speedup" in out and "how to confirm" in out.lower() and "cuda-device-max-connections" in out


def test_cli_no_match_exit_1_and_empty_exit_2(capsys):
    assert main(["diagnose", "the coffee machine is broken"]) == 1
    assert main(["diagnose", "  "]) == 2
    assert "error" in capsys.readouterr().err


def test_card_and_diagnose_stay_torch_free():
    import subprocess
    import sys

    code = ("import sys; import moe_overlap.skill.card.cards, moe_overlap.skill.diagnose.api, moe_overlap.commands.card, "
            "moe_overlap.commands.diagnose; from moe_overlap.skill.diagnose.api import diagnose; diagnose('oom'); "
            "print(sorted(m for m in ('torch', 'megatron', 'mcp') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
