"""The rollout stages: the config of each, and what to check (with the command) before moving on.

    baseline       overlap off: the control, same layout, same precision
    overlap        plain EP overlap, delayed wgrad off: the seed's minimal working configuration
    overlap+wgrad  plus delayed expert wgrad (the seed's activation example)
    flex           plus the flex dispatcher (DeepEP / HybridEP) through apply_flex_dispatcher_backend
"""

from __future__ import annotations

from typing import Any

from moe_overlap.skill.generate.model import RECOMMENDED_ENV
from moe_overlap.skill.generate.resolve import Resolved
from moe_overlap.skill.rules.flex_backend import apply_flex_dispatcher_backend

PURPOSE = {
    "baseline": "the control: EP overlap off, same layout and precision. Record its loss curve and step time.",
    "overlap": "plain EP overlap with delayed wgrad off (the seed's minimal working configuration): "
               "correctness first.",
    "overlap+wgrad": "add delayed expert weight-gradient computation, only after plain overlap matches the baseline.",
    "flex": "switch the token dispatcher to flex (DeepEP or HybridEP) through apply_flex_dispatcher_backend, "
            "only after the alltoall path is confirmed.",
}
SLUG = {"baseline": "baseline", "overlap": "overlap", "overlap+wgrad": "overlap-wgrad", "flex": "flex"}
# our verification's modes (moe_overlap.verify) for each stage; flex is verified on the all-to-all path
VERIFY_MODES = {"baseline": "baseline", "overlap": "baseline,overlap", "overlap+wgrad": "baseline,overlap+wgrad",
                "flex": "baseline,overlap+wgrad"}


def stage_config(res: Resolved, stage: str, gpu: str | None) -> tuple[dict[str, Any], list[str]]:
    """The nested config of one stage (keys in the order the seed writes them) and notes from flex activation."""
    overlap = stage != "baseline"
    comm = {"overlap_moe_expert_parallel_comm": overlap,
            "delay_wgrad_compute": stage in ("overlap+wgrad", "flex")}
    model: dict[str, Any] = {}
    if res.tp > 1:
        model["tensor_model_parallel_size"] = res.tp
        # Megatron-Core: with EP and TP, "sequence parallelism must be used" (ModelParallelConfig.__post_init__)
        model["sequence_parallel"] = True
    if res.pp > 1:
        model["pipeline_model_parallel_size"] = res.pp
        model["virtual_pipeline_model_parallel_size"] = res.vpp
        if res.layout:
            model["pipeline_model_parallel_layout"] = res.layout
    model["expert_model_parallel_size"] = res.ep
    if res.tp > 1:  # experts not tensor-parallel, so EP may span the TP ranks (Bridge's MoE recipes set it too)
        model["expert_tensor_parallel_size"] = 1
    model["num_moe_experts"] = res.experts
    if res.shape is not None:
        model.update(res.shape.megatron_fields())
    elif res.pp > 1 and res.num_layers is not None:
        model["num_layers"] = res.num_layers
    if res.topk is not None:
        model["moe_router_topk"] = res.topk
    if res.mtp:
        model["mtp_num_layers"] = res.mtp
    model["moe_token_dispatcher_type"] = "alltoall"
    model["moe_shared_expert_overlap"] = False  # the two overlaps exclude each other (no-shared-expert-overlap)
    if res.precision == "bf16":
        model["bf16"] = True
    else:  # Bridge recipes default to bf16 mixed precision: an fp16 run must turn bf16 off explicitly
        model["bf16"] = False
        model["fp16"] = True
    if res.recompute == "selective":
        model["recompute_granularity"] = "selective"
    config: dict[str, Any] = {"comm_overlap": comm, "model": model}
    if res.write_batch:
        # micro-batches per data-parallel rank = global / (micro x DP); the overlap pairs two of them
        config["train"] = {"micro_batch_size": res.micro_batch_size,
                           "global_batch_size": res.micro_batches * res.micro_batch_size * res.dp}
    # Megatron-Bridge's ConfigContainer.env_vars: applied (setdefault) before the run starts
    config["env_vars"] = {k: int(v) for k, v in RECOMMENDED_ENV.items()}
    notes: list[str] = []
    if stage == "flex" or res.dispatcher == "flex":
        config, notes = apply_flex_dispatcher_backend(config, res.backend, gpu)
    return config, notes


def _env_flags(req) -> str:
    flags = []
    for flag, value in (("--torch-version", req.torch_version), ("--te-version", req.te_version),
                        ("--gpu", req.gpu), ("--megatron-core-version", req.megatron_core_version)):
        if value is not None:
            flags.append(f"{flag} {value}")
    return (" " + " ".join(flags)) if flags else ""


def stage_checks(req, stage: str, command: str, ep: int) -> list[dict[str, str]]:
    """What to check before moving past `stage`, each with the command that checks it.

    `command` is the `moe-overlap generate ...` command of this stage without `--to`.
    """
    slug = SLUG[stage]
    log = f"train-{slug}.log"
    checks = [
        {"name": "validation", "what": "the config passes every EP-overlap rule for your torch / TE / GPU "
         "(fix every error; read every warning)",
         "command": f"{command} --to yaml > {slug}.yaml && moe-overlap validate {slug}.yaml{_env_flags(req)}"},
        {"name": "no-hang", "what": "about 20 training steps finish with no hang, NCCL timeout or assertion; the "
         "log shows the overlap settings this stage sets" + (" and moe_token_dispatcher_type=flex with the chosen "
                                                             "backend" if stage == "flex" else ""),
         "command": f"moe-overlap check-logs {log}"},
    ]
    if stage == "baseline":
        checks.append({"name": "throughput", "what": "record the step time: the reference for every later stage",
                       "command": f"grep -h 'elapsed time per iteration' {log} | tail -n 5"})
    else:
        checks.append({"name": "loss-matches-baseline", "what": "the loss follows the baseline's step by step "
                       "(same seed and data; overlap reorders work, it must not change the math beyond "
                       "bf16/fp16 rounding)",
                       "command": f"grep -ho 'lm loss: [^|]*' train-baseline.log {log} | head -n 40"})
        checks.append({"name": "throughput", "what": "the step time improves on the baseline, or at least does "
                       "not regress; if not, keep the previous stage",
                       "command": f"grep -h 'elapsed time per iteration' train-baseline.log {log} | tail -n 10"})
    spawn = (f" It spawns one process per EP rank ({ep}) on this machine: with a large EP, run the same stage "
             "at --ep 2 or 4 instead." if ep > 8 else "")
    checks.append({"name": "built-in-verification", "what": "the same structural config (EP size, experts, "
                   "top-k, precision, overlap flags) on the package's own MoE implementation: no hang, loss equal "
                   "to its baseline." + spawn, "command": f"{command} --to moe-overlap > {slug}.verify.yaml && moe-overlap "
                   f"verify {slug}.verify.yaml --modes {VERIFY_MODES[stage]}"})
    return checks
