"""Megatron-LM command-line flags (``pretrain_gpt.py --overlap-moe-expert-parallel-comm ...``) -> config sections.

Only the flags the EP-overlap rules read are mapped; the others are summarised in one info line (with a
did-you-mean where one is close to a known flag). Flag names follow Megatron-LM's ``arguments.py``; its defaults
and derivations (VPP from the layer flags, the fusion default, the layer splits) are applied by megatron_lm.py.
"""

from __future__ import annotations

import difflib
import shlex
from collections.abc import Sequence
from typing import Any

from moe_overlap.skill.config import megatron_lm
from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.config.names import near_miss

EXTRA = "megatron_lm"  # flags only the Megatron-LM derivations read; never a config section
MAX_LISTED = 12  # unknown flags named in the summary line

# flag -> (section, field, kind). kind: "true"/"false" (store_true / store_false), "int", "str", "list".
FLAGS: dict[str, tuple[str, str, str]] = {
    "--overlap-moe-expert-parallel-comm": ("comm_overlap", "overlap_moe_expert_parallel_comm", "true"),
    "--delay-wgrad-compute": ("comm_overlap", "delay_wgrad_compute", "true"),
    "--expert-model-parallel-size": ("model", "expert_model_parallel_size", "int"),
    "--num-experts": ("model", "num_moe_experts", "int"),
    "--moe-token-dispatcher-type": ("model", "moe_token_dispatcher_type", "str"),
    "--moe-flex-dispatcher-backend": ("model", "moe_flex_dispatcher_backend", "str"),
    "--moe-enable-deepep": ("model", "moe_enable_deepep", "true"),
    "--bf16": ("model", "bf16", "true"),
    "--fp16": ("model", "fp16", "true"),
    "--tensor-model-parallel-size": ("model", "tensor_model_parallel_size", "int"),
    "--pipeline-model-parallel-size": ("model", "pipeline_model_parallel_size", "int"),
    "--virtual-pipeline-model-parallel-size": ("model", "virtual_pipeline_model_parallel_size", "int"),
    "--num-layers-per-virtual-pipeline-stage": ("model", "num_layers_per_virtual_pipeline_stage", "int"),
    "--num-virtual-stages-per-pipeline-rank": ("model", "num_virtual_stages_per_pipeline_rank", "int"),
    "--pipeline-model-parallel-layout": ("model", "pipeline_model_parallel_layout", "str"),
    "--num-layers": ("model", "num_layers", "int"),
    "--decoder-first-pipeline-num-layers": (EXTRA, "decoder_first_pipeline_num_layers", "int"),
    "--decoder-last-pipeline-num-layers": (EXTRA, "decoder_last_pipeline_num_layers", "int"),
    "--account-for-embedding-in-pipeline-split": (EXTRA, "account_for_embedding_in_pipeline_split", "true"),
    "--account-for-loss-in-pipeline-split": (EXTRA, "account_for_loss_in_pipeline_split", "true"),
    "--no-overlap-p2p-communication": (EXTRA, "no_overlap_p2p_communication", "true"),
    "--recompute-activations": (EXTRA, "recompute_activations", "true"),
    "--enable-cuda-graph": (EXTRA, "enable_cuda_graph", "true"),
    "--external-cuda-graph": (EXTRA, "external_cuda_graph", "true"),
    "--context-parallel-size": ("model", "context_parallel_size", "int"),
    "--recompute-granularity": ("model", "recompute_granularity", "str"),
    "--recompute-method": ("model", "recompute_method", "str"),
    "--recompute-num-layers": ("model", "recompute_num_layers", "int"),
    "--recompute-modules": ("model", "recompute_modules", "list"),
    "--moe-shared-expert-overlap": ("model", "moe_shared_expert_overlap", "true"),
    "--moe-shared-expert-intermediate-size": ("model", "moe_shared_expert_intermediate_size", "int"),
    "--mtp-num-layers": ("model", "mtp_num_layers", "int"),
    "--cuda-graph-impl": ("model", "cuda_graph_impl", "str"),
    "--cuda-graph-scope": ("model", "cuda_graph_scope", "list"),
    "--cuda-graph-modules": ("model", "cuda_graph_modules", "list"),
    "--fine-grained-activation-offloading": ("model", "fine_grained_activation_offloading", "true"),
    "--offload-modules": ("model", "offload_modules", "list"),
    "--moe-grouped-gemm": ("model", "moe_grouped_gemm", "true"),
    "--moe-use-legacy-grouped-gemm": ("model", "moe_use_legacy_grouped_gemm", "true"),
    "--no-gradient-accumulation-fusion": ("model", "gradient_accumulation_fusion", "false"),
    "--disable-bias-linear": ("model", "add_bias_linear", "false"),
    "--add-qkv-bias": ("model", "add_qkv_bias", "true"),
    "--transformer-impl": ("model", "transformer_impl", "str"),
    "--ep-overlap-early-attn-memory-release": ("model", "ep_overlap_early_attn_memory_release", "true"),
    "--overlap-dispatch-backward-with-experts-wgrad": ("model", "overlap_dispatch_backward_with_experts_wgrad", "true"),
    "--overlap-grad-reduce": ("ddp", "overlap_grad_reduce", "true"),
    "--use-megatron-fsdp": ("ddp", "use_megatron_fsdp", "true"),
    "--fsdp-double-buffer": ("ddp", "fsdp_double_buffer", "true"),
    "--overlap-param-gather": ("ddp", "overlap_param_gather", "true"),
    "--use-distributed-optimizer": ("ddp", "use_distributed_optimizer", "true"),
    "--micro-batch-size": ("train", "micro_batch_size", "int"),
    "--global-batch-size": ("train", "global_batch_size", "int"),
    "--data-parallel-size": ("train", "data_parallel_size", "int"),
}


def _int(flag: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{flag} expects an integer, got {value!r}", field=flag) from None


def _summary(unknown: list[tuple[str, str]]) -> list[megatron_lm.Note]:
    """One info line for every flag no rule reads (a launch script has dozens: data paths, optimiser, logging)."""
    if not unknown:
        return []
    named = ", ".join(flag + hint for flag, hint in unknown[:MAX_LISTED])
    more = f" and {len(unknown) - MAX_LISTED} more" if len(unknown) > MAX_LISTED else ""
    return [("unknown-key", "argv", f"{len(unknown)} Megatron-LM flag(s) that no EP-overlap rule reads, kept and "
             f"not checked: {named}{more}")]


# Mapped flags that not every release's parser has (first, last release line; None = open): Megatron-LM stops
# with "unrecognized arguments" on a flag its release lacks. From each release's parser (tests/oracle/mlm_driver.py
# --list-flags; tests/unit/test_oracle_megatron_lm.py checks this table against it). --data-parallel-size is the
# validator's own hint (Megatron-LM derives the DP size from WORLD_SIZE) and is not listed.
FLAG_RELEASES: dict[str, tuple[tuple[int, int] | None, tuple[int, int] | None]] = {
    "--virtual-pipeline-model-parallel-size": ((99, 0), None),  # no release: VPP comes from the three VPP flags
    "--cuda-graph-modules": ((0, 18), None),
    "--overlap-dispatch-backward-with-experts-wgrad": ((0, 18), None),
    "--moe-use-legacy-grouped-gemm": (None, (0, 16)),
}


def parse_argv(argv: str | Sequence[str]) -> tuple[dict[str, dict[str, Any]], list[megatron_lm.Note], list[str]]:
    """Megatron-LM flags -> ({section: {field: value}} as Megatron-LM's validate_args leaves them, notes, the
    mapped flags given)."""
    try:
        tokens = shlex.split(argv) if isinstance(argv, str) else list(argv)
    except ValueError as exc:  # shlex: "No closing quotation", "No escaped character"
        raise ConfigError(f"argv: cannot split the flags into words ({exc})", field="argv",
                          fix="close the quote or escape it, as a shell would need") from None
    sections: dict[str, dict[str, Any]] = {}
    unknown: list[tuple[str, str]] = []
    given: list[str] = []
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if not tok.startswith("--"):
            continue  # the script name, or a positional: not ours to read
        flag, eq, inline = tok.partition("=")
        values: list[str] = [inline] if eq else []
        while not eq and i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        spec = FLAGS.get(flag)
        if spec is None and (near := near_miss(flag, FLAGS)) is not None:
            # A misspelt flag the validator reads would leave its setting at the default: never a silent pass.
            raise ConfigError(f"Megatron-LM flag {flag[:80]} is one edit away from {near}: a misspelt flag is not "
                              "read, so the setting it means would silently keep its default", field=flag[:80],
                              fix=f"spell it {near}")
        if spec is None:
            close = difflib.get_close_matches(flag, FLAGS, n=1, cutoff=0.8) if len(flag) < 100 else []
            unknown.append((flag[:80], f" (did you mean {close[0]}?)" if close else ""))
            continue
        section, field, kind = spec
        given.append(flag)
        if kind in ("true", "false"):
            if values:
                raise ConfigError(f"{flag} is a switch and takes no value, got {' '.join(values)!r}", field=flag)
            value: Any = kind == "true"
        elif kind == "list":
            value = values
        else:
            if len(values) != 1:
                raise ConfigError(f"{flag} expects one value, got {len(values)}", field=flag)
            value = _int(flag, values[0]) if kind == "int" else values[0]
        sections.setdefault(section, {})[field] = value
    extra = sections.pop(EXTRA, {})
    model = sections.setdefault("model", {})
    notes: list[megatron_lm.Note] = []
    if extra.get("recompute_activations"):  # validate_args: --recompute-activations means selective recompute
        model["recompute_granularity"] = "selective"
        notes.append(("derived-value", "model.recompute_granularity",
                      "--recompute-activations read as --recompute-granularity selective (as Megatron-LM does)"))
    for flag, impl in (("enable_cuda_graph", "local"), ("external_cuda_graph", "transformer_engine")):
        if extra.get(flag) and "cuda_graph_impl" not in model:  # the deprecated switches of --cuda-graph-impl
            model["cuda_graph_impl"] = impl
            notes.append(("derived-value", "model.cuda_graph_impl", f"--{flag.replace('_', '-')} read as "
                          f"--cuda-graph-impl {impl} (its deprecated spelling)"))
    notes += megatron_lm.apply(sections, extra)
    return sections, notes + _summary(unknown), given
