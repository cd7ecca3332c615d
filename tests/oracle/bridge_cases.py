"""Bridge-style configs for the Megatron-Bridge 0.6.2 oracle, built from the Core generator's configs.

Each case starts from `generate` / `near_valid` at the Core line Bridge 0.6.2 pins (0.19) and is then written the
ways Bridge users write it: the overlap flags in `comm_overlap:` (Bridge's recipes), on the model with no
`comm_overlap:` section, or on the model beside a `comm_overlap:` section that leaves them unset (Bridge then
sets them to False: comm_overlap.py:438-439, :559, :618); `comm_overlap.overlap_grad_reduce` beside
`ddp.overlap_grad_reduce`; a mixed-precision recipe name instead of model.bf16/fp16; a recipe's
`apply_flex_dispatcher_backend(model, backend)` call; a real GPU name (as torch reports it) for the flex
allow-lists. `cuda_graph_impl: local` becomes transformer_engine: Bridge refuses local per-layer graphs for any
model (utils/cuda_graph.py:146-153), which is no EP-overlap check.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from tests.oracle.generate import core_kwargs, generate, near_valid

LINE = (0, 19)  # Megatron-Bridge 0.6.x pins Megatron-LM cd4afffa (3rdparty/Megatron-LM), megatron-core 0.19.0
CORE_RELEASE = "0.19.2"
# torch.cuda.get_device_properties(0).name as torch prints it -> compute capability major (NVIDIA's CUDA GPU table).
GPUS = {"NVIDIA H100 80GB HBM3": 9, "NVIDIA H200": 9, "NVIDIA H20": 9, "NVIDIA A100-SXM4-80GB": 8,
        "NVIDIA L40S": 8, "NVIDIA B200": 10, "NVIDIA B300 SXM6 AC": 10, "NVIDIA GB200": 10, "NVIDIA GB300": 10,
        "Tesla V100-SXM2-32GB": 7, "Tesla T4": 7}
RECIPES = ("bf16_mixed", "fp16_mixed", "bf16-mixed")
FLAGS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute")


def _bridge_style(rng: random.Random, config: dict, env: dict) -> dict:
    model, comm = config["model"], config.pop("comm_overlap")
    placement = rng.choices(["comm", "model", "model+comm", "split"], weights=[64, 12, 12, 12])[0]
    if placement == "comm":
        config["comm_overlap"] = comm
    elif placement == "split":  # the overlap on the model, the delayed wgrad in comm_overlap (Bridge: :532-535)
        model["overlap_moe_expert_parallel_comm"] = comm["overlap_moe_expert_parallel_comm"]
        config["comm_overlap"] = {"delay_wgrad_compute": comm["delay_wgrad_compute"]}
    else:
        model.update(comm)
        if placement == "model+comm":
            config["comm_overlap"] = {}
    if "comm_overlap" in config and rng.random() < 0.25:
        config["comm_overlap"]["overlap_grad_reduce"] = rng.choice([True, False])
    if model.get("cuda_graph_impl") == "local":
        model["cuda_graph_impl"] = "transformer_engine"
    if rng.random() < 0.2:
        model.pop("gradient_accumulation_fusion", None)  # the TransformerConfig default (False)
    if rng.random() < 0.2:
        config["mixed_precision"] = rng.choice(RECIPES)
        model.update(bf16=False, fp16=False)
    if rng.random() < 0.15:  # one of Bridge's delayed-wgrad TE checks, with Core's checks of the same fields met
        _bridge_wgrad_break(rng, config, env)
    case = {"config": config, "env": env, "gpu": rng.choice(list(GPUS)), "apply_backend": None,
            "apply_without_gpu": False}
    if rng.random() < 0.3:
        # A config built where no GPU is visible (a login node): Bridge applies the backend unchecked
        # (flex_dispatcher_backend.py:53-57); the training node's GPU is checked at validation.
        case["apply_without_gpu"] = rng.random() < 0.2
        drop_and_pad = model.get("moe_pad_expert_input_to_capacity")  # deepep cannot pad (Core refuses)
        case["apply_backend"] = rng.choice(["hybridep", "ncclep"] if drop_and_pad else
                                           ["deepep", "deepep", "hybridep", "ncclep"])
        model["moe_token_dispatcher_type"] = rng.choice(["alltoall", model["moe_token_dispatcher_type"]])
        if model.get("moe_enable_deepep") or model.get("moe_flex_dispatcher_backend") == "ncclep":
            model.pop("moe_enable_deepep", None)  # the deprecated switch and a recipe's backend call fight
            model.pop("moe_flex_dispatcher_backend", None)
    case["env"]["gpu"] = case["gpu"]
    return case


def _bridge_wgrad_break(rng: random.Random, config: dict, env: dict) -> None:
    model, ddp = config["model"], config["ddp"]
    config["comm_overlap"] = {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True,
                              "overlap_grad_reduce": False}
    ddp["overlap_grad_reduce"] = False
    model.update(cuda_graph_impl="none", cuda_graph_scope=None)
    kind = rng.choice(["fusion", "grad-reduce", "graph"])
    if kind == "fusion":  # TE >= 2.7 with gradient_accumulation_fusion (comm_overlap.py:526-530)
        model["gradient_accumulation_fusion"] = True
        env["te_version"] = "2.6.0"
    elif kind == "grad-reduce":  # TE >= 2.7 with overlap_grad_reduce in either section (:521-525)
        model["gradient_accumulation_fusion"] = False
        (ddp if rng.random() < 0.5 else config["comm_overlap"])["overlap_grad_reduce"] = True
        env["te_version"] = "2.6.0"
    else:  # TE >= 2.12 when the wgrad falls in the graph (:537-557); Core asks only 2.10 of TE graphs
        model.update(gradient_accumulation_fusion=True, add_bias_linear=False, add_qkv_bias=False,
                     cuda_graph_impl="transformer_engine", cuda_graph_scope=["attn"])
        env["te_version"] = rng.choice(["2.10.0", "2.11.0"])


def cases(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        config, env = generate(rng, LINE) if i % 2 else near_valid(rng, LINE)
        out.append(_bridge_style(rng, config, env))
    return out


def driver_case(case: dict) -> dict:
    """What the child needs: the model's TransformerConfig kwargs (the flags only where the model sets them),
    the comm_overlap and ddp sections, the recipe names, the versions and the GPU."""
    config = case["config"]
    model_only = {"model": copy.deepcopy(config["model"]), "comm_overlap": {}}
    ddp = {k: v for k, v in config["ddp"].items() if k in ("overlap_grad_reduce", "use_megatron_fsdp")}
    return {"kwargs": core_kwargs(model_only, LINE), "comm_overlap": config.get("comm_overlap"), "ddp": ddp,
            "mixed_precision": config.get("mixed_precision"), "apply_backend": case["apply_backend"],
            "apply_without_gpu": case["apply_without_gpu"],
            "gpu": {"name": case["gpu"], "major": GPUS[case["gpu"]]},
            "torch": case["env"]["torch_version"], "te": case["env"]["te_version"]}
