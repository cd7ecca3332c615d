"""diagnose(): ranks the card's failure modes against error text; every real Megatron-Core EP-overlap
assertion message maps to the right failure mode."""

import ast
import importlib.util
import json
import re
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
    # a bare OOM is no evidence of the overlap (test_bare_oom_is_not_an_ep_overlap_failure); with the overlap named it is
    ("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB after enabling overlap_moe_expert_parallel_comm",
     "out-of-memory-after-enabling"),
    ("the loss diverges from the baseline after 200 steps", "loss-diverges-from-baseline"),
    ("WARNING: DeepEP is not supported on this GPU, falling back to alltoall", "flex-unsupported-gpu"),
    ("validate says: error ep-divides-experts", "experts-not-divisible-by-ep"),
]

# Megatron-Core TransformerConfig messages (substring) -> the failure mode that must rank first.
CORE_MESSAGES = {
    "hang issue with torch version": "old-torch-hang",
    "virtual_pipeline_model_parallel_size must be specified": "pipeline-without-virtual-stages",
    "only supported with expert model parallelism": "overlap-without-expert-parallelism",
    "alltoall/flex token dispatcher": "unsupported-dispatcher",
    "disable full recomputation": "recompute-conflict",
    "disable recomputation method": "recompute-conflict",
    "recompute_num_layers must be None": "recompute-conflict",
    "disable moe in recompute_modules": "recompute-conflict",
    "only supported with bf16 or fp16": "fp32-precision",
    "disable moe_shared_expert_overlap": "shared-expert-overlap-conflict",
    "MTP layernum only supports 1": "mtp-layers",
    "MTP supports at most one layer": "mtp-layers",
    "with MTP layer": "mtp-layers",
    "CUDA graph scope on moe and mlp": "cuda-graph-scope-includes-moe",
    "ncclep does not support offloading": "ncclep-fc1-offload",
    "must be enabled when enabling delay_wgrad_compute": "delayed-wgrad-without-overlap",
    "legacy groupedgemm": "delayed-wgrad-legacy-grouped-gemm",
    "TE version >= 2.10.0 is required for delay_wgrad_compute": "delayed-wgrad-te-version",
    "overlap_dispatch_backward_with_experts_wgrad": "dispatch-wgrad-conflict",
    "enabling ep_overlap_early_attn_memory_release": "early-attn-release-without-overlap",
    "DeepEP backend is only supported with flex": "deepep-flag-conflict",
    "Only one backend is supported for flex": "deepep-flag-conflict",
    "moe_flex_dispatcher_backend='ncclep' requires": "ncclep-backend",
}
# Checks nested under the same flags that are about something else: not EP-overlap failure modes.
NOT_EP_OVERLAP = (
    "moe_expert_rank_capacity_factor requires",  # 0.19: a flex-backend sizing option, not an overlap check
    "does not support moe_pad_expert_input_to_capacity",  # deepep with drop-and-pad
    "moe_deepep_num_sms", "moe_hybridep_num_sms",
)
# Messages raised outside TransformerConfig, verbatim from upstream (file in the megatron-core 0.19.2 / the
# megatron-bridge 0.6.2 wheels) -> (failure mode that must rank first, words its fix must contain, words it must not).
UPSTREAM_MESSAGES = {
    # megatron-bridge 0.6.2 src/megatron/bridge/training/comm_overlap.py:535
    "overlap_moe_expert_parallel_comm is required for delay_wgrad_compute":
        ("delayed-wgrad-without-overlap", ["Enable overlap_moe_expert_parallel_comm"], []),
    # comm_overlap.py:550-552
    "CUDA graph with delay_wgrad_compute requires gradient_accumulation_fusion to be enabled. This is because default "
    "gradient accumulation does not use static memory addresses, which breaks CUDA graph requirements.":
        ("delayed-wgrad-graph-needs-fusion", ["gradient_accumulation_fusion on"], ["fusion off", "turn off gradient"]),
    # comm_overlap.py:556 and megatron-core 0.19.2 megatron/training/arguments.py:1846
    "CUDA graph with delay_wgrad_compute does not support attention bias for now.":
        ("delayed-wgrad-attention-bias", ["add_bias_linear false", "add_qkv_bias false"], ["Upgrade"]),
    "CUDA graph with delay_wgrad_compute doesn't support attn bias for now.":
        ("delayed-wgrad-attention-bias", ["add_bias_linear false"], ["Upgrade"]),
    # arguments.py:1850-1851
    "disabling gradient_accumulation_fusion is only supported with TE >= 2.7.0 when enabling delay_wgrad_compute":
        ("delayed-wgrad-fusion-off-te", ["gradient_accumulation_fusion back on"], ["turn off gradient"]),
    # arguments.py:1827
    "overlap_grad_reduce is only supported with TE >= 2.8.0 when enabling delay_wgrad_compute":
        ("delayed-wgrad-te-version", ["Upgrade Transformer Engine"], []),
    # arguments.py:1824
    "Delaying wgrad compute is only supported with transformer_engine implementation":
        ("delayed-wgrad-needs-te-layers", ["transformer_engine"], []),
    # megatron-core 0.19.2 megatron/core/extensions/transformer_engine.py:920
    "Only TE with version >=2.3.0 supports delay_wgrad_compute now.": ("delayed-wgrad-te-version", ["Upgrade"], []),
    # megatron/core/transformer/transformer_layer.py:1263-1264
    "EP overlap must be disabled when CUDA graph captures the whole MLP/MoE part.":
        ("cuda-graph-whole-layer", ["moe_router"], []),
    # megatron/core/distributed/fsdp/mcore_fsdp_adapter.py:170, 174
    "1F1B overlap with FSDP does not support double buffer. Please set fsdp_double_buffer=False in the ddp config.":
        ("fsdp-overlap-limits", ["fsdp_double_buffer false"], []),
    # megatron/core/transformer/moe/token_dispatcher.py (megatron-core 0.18.2:1441)
    "Invalid backend: ncclepPlease set --moe-flex-dispatcher-backend=deepep or --moe-flex-dispatcher-backend=hybridep":
        ("ncclep-backend", ["deepep or hybridep"], []),
    # megatron-bridge 0.6.2 flex_dispatcher_backend.py:110-113 (ValueError) and :64-67 (the fallback warning)
    "ValueError: DeepEP is supported for Ampere, Hopper, and Blackwell (B200/B300) GPUs. Current GPU: NVIDIA GB200":
        ("flex-unsupported-gpu", ["alltoall"], []),
    "DeepEP is only applicable to Ampere, Hopper, and Blackwell (B200/B300) GPUs. Current GPU: Tesla T4. "
    "Falling back to alltoall.": ("flex-unsupported-gpu", ["alltoall"], []),
    # the AttributeError a Bridge recipe gives (ConfigContainer.comm_overlap defaults to None, config.py:1007)
    "AttributeError: 'NoneType' object has no attribute 'overlap_moe_expert_parallel_comm'":
        ("bridge-comm-overlap-none", ["CommOverlapConfig(tp_comm_overlap=False)"], []),
    # megatron-core 0.19.2 megatron/core/utils.py (get_attr_wrapped_model) and combined_1f1b.py:384-389
    "RuntimeError: _get_attr_wrapped_model couldn't find attribute build_schedule_plan":
        ("model-without-schedule-plan", ["GPTModel", "return_schedule_plan"], []),
    "TypeError: forward_step() got an unexpected keyword argument 'return_schedule_plan'":
        ("model-without-schedule-plan", ["return_schedule_plan"], []),
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


_CHECK_FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "overlap_dispatch_backward_with_experts_wgrad",
                "ep_overlap_early_attn_memory_release", "moe_enable_deepep", "moe_flex_dispatcher_backend")


def _config_sources() -> list[Path]:
    """transformer_config.py of every unpacked release (make oracle-releases), else of the installed one."""
    from tests.oracle import releases

    found = [releases.release_dir(v) / "megatron" / "core" / "transformer" / "transformer_config.py"
             for v in releases.RELEASES if releases.is_unpacked(v)]
    if found:
        return found
    spec = importlib.util.find_spec("megatron.core")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("megatron-core not installed or unpacked")
    return [Path(next(iter(spec.submodule_search_locations))) / "transformer" / "transformer_config.py"]


def _message(node) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):  # f-strings: the literal parts
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _core_assert_messages() -> list[str]:
    """Every assert / raise message under an `if self.<EP-overlap flag>...:` of TransformerConfig, all releases."""
    messages = []
    for source in _config_sources():
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.If):
                continue
            names = {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
            if not names & set(_CHECK_FLAGS):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assert) and (msg := _message(sub.msg)):
                    messages.append(msg)
                elif isinstance(sub, ast.Raise) and isinstance(sub.exc, ast.Call) and sub.exc.args:
                    if (msg := _message(sub.exc.args[0])) and "flex" in msg.lower() or msg and "ncclep" in msg:
                        messages.append(msg)
    return sorted(set(messages))


def test_every_megatron_core_overlap_check_is_diagnosed():
    messages = _core_assert_messages()
    assert len(messages) >= 15, messages
    for msg in messages:
        keys = [k for k in CORE_MESSAGES if k in msg]
        if not keys and any(k in msg for k in NOT_EP_OVERLAP):
            continue
        assert keys, f"new Megatron-Core message with no failure mode: {msg!r}"
        top = diagnose(f"AssertionError: {msg}").matches
        assert top and top[0].failure_mode == CORE_MESSAGES[keys[0]], (msg, [m.failure_mode for m in top])


@pytest.mark.parametrize("message", sorted(UPSTREAM_MESSAGES))
def test_upstream_messages_get_the_right_fix(message):
    expected, must, must_not = UPSTREAM_MESSAGES[message]
    top = diagnose(message).matches
    assert top and top[0].failure_mode == expected, [m.failure_mode for m in top]
    for words in must:
        assert words in top[0].fix, (words, top[0].fix)
    for words in must_not:
        assert words not in top[0].fix, (words, top[0].fix)


def test_upstream_messages_are_verbatim():
    """Each upstream message above is in its upstream file (when the wheels are unpacked: make oracle-releases)."""
    from tests.oracle import releases
    from tests.oracle.fetch import bridge_dir

    roots = [releases.release_dir(v) for v in releases.RELEASES if releases.is_unpacked(v)] + [bridge_dir()]
    texts = [f.read_text(encoding="utf-8", errors="replace") for root in roots if root.is_dir()
             for f in root.rglob("*.py") if "megatron" in f.parts]
    if len(roots) < 5 or not texts:
        pytest.skip("megatron-core releases / megatron-bridge not unpacked")
    # Adjacent string literals across lines read as one message ("... fusion "\n    "to be enabled").
    joined = re.sub(r"""(?<=[^\\])['"]\s*\n\s*f?['"]""", "", "\n".join(texts))
    joined = " ".join(re.sub(r"\\\n", " ", joined).split())  # backslash continuations and indents: one space
    skip = ("AttributeError", "RuntimeError: _get", "TypeError", "Invalid backend", "ValueError: DeepEP", "Current GPU")
    for message in UPSTREAM_MESSAGES:
        if not message.startswith(skip) and "Current GPU" not in message:
            assert " ".join(message.split(". This")[0].split(". Please")[0].split()) in joined, message


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
