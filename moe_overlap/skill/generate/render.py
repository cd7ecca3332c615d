"""Render a generated config in the formats users paste (torch-free).

The one input is a nested config with Megatron-Bridge ConfigContainer sections (``comm_overlap``,
``model``, ``train``), keys in the order they should be printed. Formats:

    bridge-python  ``cfg.<section>.<key> = <value>`` lines; ``cfg.comm_overlap`` is created first when the
                   recipe left it None; a flex dispatcher is written as the
                   ``apply_flex_dispatcher_backend(cfg.model, ...)`` call, because setting the backend
                   field alone does nothing in Megatron-Bridge (rule flex-backend-needs-flex-dispatcher)
    overrides      dotted ``section.key=value`` lines, the override syntax of Megatron-Bridge scripts
    megatron-args  Megatron-LM flags, one per line (false booleans are left out: false is their default), after
                   an ``export`` line for the ``env_vars`` section (the launcher's environment)
    yaml, json     the nested config itself; ``env_vars`` is Megatron-Bridge's ConfigContainer field
    moe-overlap    a run config of our own verification (moe_overlap.verify.plan.config.VerifyConfig)
"""

from __future__ import annotations

import json
from typing import Any

import yaml

FORMATS = ("bridge-python", "overrides", "megatron-args", "yaml", "json", "moe-overlap")

FLEX_IMPORT = "from megatron.bridge.training.flex_dispatcher_backend import apply_flex_dispatcher_backend"
COMM_IMPORT = "from megatron.bridge.training.comm_overlap import CommOverlapConfig"
# Bridge recipes ship `comm_overlap=None` (ConfigContainer's default), so a field cannot be set on it directly.
COMM_CREATE = ["if cfg.comm_overlap is None:  # Bridge recipes ship comm_overlap=None",
               "    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)"]

# (section, key) -> Megatron-LM flag. Names from megatron/training/arguments.py (Megatron-LM); Bridge's
# `num_moe_experts` is `--num-experts` there. VPP has no direct flag: see _vpp_flag.
MEGATRON_FLAGS: dict[tuple[str, str], str] = {
    ("comm_overlap", "overlap_moe_expert_parallel_comm"): "--overlap-moe-expert-parallel-comm",
    ("comm_overlap", "delay_wgrad_compute"): "--delay-wgrad-compute",
    ("model", "tensor_model_parallel_size"): "--tensor-model-parallel-size",
    ("model", "sequence_parallel"): "--sequence-parallel",
    ("model", "pipeline_model_parallel_size"): "--pipeline-model-parallel-size",
    ("model", "expert_model_parallel_size"): "--expert-model-parallel-size",
    ("model", "num_moe_experts"): "--num-experts",
    ("model", "moe_router_topk"): "--moe-router-topk",
    ("model", "moe_token_dispatcher_type"): "--moe-token-dispatcher-type",
    ("model", "moe_flex_dispatcher_backend"): "--moe-flex-dispatcher-backend",
    ("model", "moe_shared_expert_overlap"): "--moe-shared-expert-overlap",
    ("model", "moe_shared_expert_intermediate_size"): "--moe-shared-expert-intermediate-size",
    ("model", "bf16"): "--bf16",
    ("model", "fp16"): "--fp16",
    ("model", "num_layers"): "--num-layers",
    ("model", "hidden_size"): "--hidden-size",
    ("model", "num_attention_heads"): "--num-attention-heads",
    ("model", "moe_ffn_hidden_size"): "--moe-ffn-hidden-size",
    ("model", "mtp_num_layers"): "--mtp-num-layers",
    # from 0.17 Megatron-LM builds these from TransformerConfig's fields (ArgumentGroupFactory): field -> --field
    ("model", "expert_tensor_parallel_size"): "--expert-tensor-parallel-size",
    ("model", "ffn_hidden_size"): "--ffn-hidden-size",
    ("model", "kv_channels"): "--kv-channels",
    ("model", "num_query_groups"): "--group-query-attention --num-query-groups",
    ("model", "multi_latent_attention"): "--multi-latent-attention",
    ("model", "q_lora_rank"): "--q-lora-rank",
    ("model", "kv_lora_rank"): "--kv-lora-rank",
    ("model", "qk_head_dim"): "--qk-head-dim",
    ("model", "qk_pos_emb_head_dim"): "--qk-pos-emb-head-dim",
    ("model", "v_head_dim"): "--v-head-dim",
    ("model", "moe_layer_freq"): "--moe-layer-freq",
    ("model", "pipeline_model_parallel_layout"): "--pipeline-model-parallel-layout",
    ("model", "recompute_granularity"): "--recompute-granularity",
    ("train", "micro_batch_size"): "--micro-batch-size",
    ("train", "global_batch_size"): "--global-batch-size",
}


class RenderError(ValueError):
    """A config this module cannot write in the asked format (names the key or the format)."""


def render(config: dict[str, Any], fmt: str, *, micro_batches: int | None = None) -> str:
    """`config` (nested sections) as text in `fmt`; ends with a newline."""
    if fmt not in FORMATS:
        raise RenderError(f"to: unknown output format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "yaml":
        return yaml.safe_dump(config, sort_keys=False)
    if fmt == "json":
        return json.dumps(config, indent=2) + "\n"
    if fmt == "bridge-python":
        return "\n".join(bridge_python_lines(config)) + "\n"
    if fmt == "overrides":
        return "\n".join(override_items(config)) + "\n"
    if fmt == "megatron-args":
        env = env_line(config)
        return "\n".join(([env] if env else []) + megatron_arg_lines(config)) + "\n"
    return yaml.safe_dump(to_verify_config(config, micro_batches=micro_batches), sort_keys=False)


def _items(config: dict[str, Any]):
    for section, values in config.items():
        if not isinstance(values, dict):
            raise RenderError(f"{section}: expected a section mapping, got {type(values).__name__}")
        for key, value in values.items():
            yield section, key, value


def _py(value: Any) -> str:
    # json.dumps gives the double-quoted strings of the seed's examples; booleans/None need Python names.
    if isinstance(value, bool) or value is None:
        return repr(value)
    return json.dumps(value)


def bridge_python_lines(config: dict[str, Any]) -> list[str]:
    model = config.get("model", {})
    flex = model.get("moe_token_dispatcher_type") == "flex"
    comm = bool(config.get("comm_overlap"))
    env = config.get("env_vars") or {}
    imports = (["import os"] if env else []) + ([COMM_IMPORT] if comm else []) + ([FLEX_IMPORT] if flex else [])
    lines = imports + [""] if imports else []
    if env:  # before CUDA starts; the process value wins over a recipe's env_vars (Bridge applies them with setdefault)
        lines += [f"os.environ[{_py(k)}] = {_py(str(v))}" for k, v in env.items()]
    if comm:
        lines += COMM_CREATE
    for section, key, value in _items(config):
        if section == "env_vars":
            lines.append(f"cfg.env_vars[{_py(key)}] = {_py(value)}")
            continue
        if flex and section == "model" and key in ("moe_token_dispatcher_type", "moe_flex_dispatcher_backend"):
            continue  # set by the helper below, together with the GPU check
        lines.append(f"cfg.{section}.{key} = {_py(value)}")
    if flex:
        backend = model.get("moe_flex_dispatcher_backend", "deepep")
        lines += ["", f"apply_flex_dispatcher_backend(cfg.model, moe_flex_dispatcher_backend={_py(backend)})"]
    return lines


def _scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_scalar(v) for v in value) + "]"
    return str(value)


def override_items(config: dict[str, Any]) -> list[str]:
    """``section.key=value`` items (the list the validator's ``overrides=`` takes)."""
    return [f"{section}.{key}={_scalar(value)}" for section, key, value in _items(config)]


def megatron_argv(config: dict[str, Any]) -> list[str]:
    """Megatron-LM argv tokens (the list the validator's argv parser takes)."""
    argv: list[str] = []
    for line in megatron_arg_lines(config):
        argv.extend(line.split(" "))
    return argv


def _vpp_flag(model: dict[str, Any], vpp: int) -> str:
    # Megatron-LM takes the layers per virtual stage and derives VPP = layers / (pp x that); the validator
    # reads the same flag. Without the layer count VPP can only be given as virtual stages per rank.
    layers, pp = model.get("num_layers"), model.get("pipeline_model_parallel_size", 1)
    if layers and layers % (pp * vpp) == 0:
        return f"--num-layers-per-virtual-pipeline-stage {layers // (pp * vpp)}"
    return f"--num-virtual-stages-per-pipeline-rank {vpp}"


def env_line(config: dict[str, Any]) -> str | None:
    env = config.get("env_vars") or {}
    return ("export " + " ".join(f"{k}={v}" for k, v in env.items())) if env else None


def _shell_value(key: str, value: Any) -> str:
    if key == "moe_layer_freq" and isinstance(value, list):
        return "'" + _freq_expr(value) + "'"  # Megatron-LM evaluates the pattern; quoted for the shell
    if key == "pipeline_model_parallel_layout":
        return "'" + str(value) + "'"
    return _scalar(value)


def _freq_expr(freq: list[int]) -> str:
    """[0, 0, 0, 1, 1, ...] -> '([0]*3+[1]*58)', the pattern form of --moe-layer-freq."""
    runs: list[tuple[int, int]] = []
    for v in freq:
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def megatron_arg_lines(config: dict[str, Any]) -> list[str]:
    """The flags, one per line (the env_vars section is the export line of render(), not a flag)."""
    lines = []
    layout = config.get("model", {}).get("pipeline_model_parallel_layout")
    for section, key, value in _items(config):
        if section == "env_vars":
            continue
        if (section, key) == ("model", "virtual_pipeline_model_parallel_size") and value is not None:
            if not layout:  # Megatron-LM takes one of the layout and the VPP flags and derives VPP from the layout
                lines.append(_vpp_flag(config["model"], int(value)))
            continue
        flag = MEGATRON_FLAGS.get((section, key))
        if flag is None:
            raise RenderError(f"{section}.{key}: no Megatron-LM flag is known for this key; "
                              "use --to overrides, yaml or json")
        if isinstance(value, bool):
            if value:
                lines.append(flag)
            continue  # a store_true flag left out is false
        if value is None:
            continue
        lines.append(f"{flag} {_shell_value(key, value)}")
    return lines


def to_verify_config(config: dict[str, Any], *, micro_batches: int | None = None) -> dict[str, Any]:
    """The ``moe-overlap`` run config of our verification for this config.

    Only the structural choices carry over (EP size, experts, top-k, precision, overlap flags, micro-batches):
    the verification checks the overlap machinery on its small built-in model, so the model size stays at
    VerifyConfig's defaults. Its one dispatcher is all-to-all; a flex config is verified on that path.
    """
    model = config.get("model", {})
    comm = config.get("comm_overlap", {})
    overlap = bool(comm.get("overlap_moe_expert_parallel_comm", False))
    experts = int(model.get("num_moe_experts", 4))
    out: dict[str, Any] = {
        "format": "moe-overlap",
        "num_moe_experts": experts,
        "moe_router_topk": min(int(model.get("moe_router_topk", 2)), experts),
        "expert_model_parallel_size": int(model.get("expert_model_parallel_size", 2)),
        "precision": "bf16" if model.get("bf16") else "fp16" if model.get("fp16") else "fp32",
        "overlap_moe_expert_parallel_comm": overlap,
        "delay_wgrad_compute": bool(comm.get("delay_wgrad_compute", False)),
        # 1f1b is Megatron-Core's overlap (forward of micro-batch k+1 beside backward of k); none is the control
        "schedule": "1f1b" if overlap else "none",
    }
    if micro_batches is not None:
        out["micro_batches"] = int(micro_batches)
    return out
