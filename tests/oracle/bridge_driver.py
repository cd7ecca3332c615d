"""Run inside a child Python whose sys.path starts with the megatron-core release Megatron-Bridge 0.6.2 pins.

Argv: the unpacked Megatron-Bridge folder (the one holding megatron/bridge). Reads a JSON list of cases from
stdin and runs each through Bridge's own code in the order its runtime_config_update and ConfigContainer.validate
do (megatron-bridge 0.6.2 src/megatron/bridge/training/config.py:1860-1890, :1256-1262, :1511-1515):

  apply   apply_flex_dispatcher_backend(model, backend)        (what a recipe calls; flex_dispatcher_backend.py)
  mixed   get_mixed_precision_config(name).setup(model)         (mixed_precision.py)
  comm    CommOverlapConfig(...).finalize(); .setup(model, optimizer, ddp)   (comm_overlap.py: Bridge's checks)
  graphs  validate_cuda_graph_configuration(model)              (utils/cuda_graph.py)
  core    model.finalize(): Core's TransformerConfig.__post_init__ (Bridge's models defer it to finalize)
  flex    validate_flex_dispatcher_backend(model)               (flex_dispatcher_backend.py)

Bridge's heavy imports (its model providers, which pull in transformers; common_utils, which pulls in
megatron.training) are stubbed: comm_overlap.py uses the providers only in type hints, flex_dispatcher_backend.py
only get_rank_safe. The Bridge package __init__ files are skipped (their folders are mounted as bare packages),
so exactly the files named above run. torch.cuda answers with the case's GPU (name, major), or, for a config
built where no GPU is visible, reports none while the backend is applied; Core's and Bridge's
torch / TE version probes answer with the case's versions. Prints one JSON document: per case [accepted, stage,
exception type, message, the dispatcher fields after apply]. Standalone: it must not import moe_overlap.
"""

from __future__ import annotations

import json
import logging
import sys
import types
import warnings
from pathlib import Path
from types import SimpleNamespace

from core_driver import _at_least  # the same version comparison as the Core oracle


def _package(name: str, path: Path | None = None) -> types.ModuleType:
    module = types.ModuleType(name)
    if path is not None:
        module.__path__ = [str(path)]
    sys.modules[name] = module
    return module


def _mount_bridge(root: Path) -> None:
    bridge = root / "megatron" / "bridge"
    _package("megatron.bridge", bridge)
    _package("megatron.bridge.training", bridge / "training")
    _package("megatron.bridge.utils", bridge / "utils")
    models = _package("megatron.bridge.models")
    models.GPTModelProvider = type("GPTModelProvider", (), {})
    models.T5ModelProvider = type("T5ModelProvider", (), {})
    _package("megatron.bridge.models.gpt")
    _package("megatron.bridge.models.gpt.gpt_builder").GPTModelConfig = type("GPTModelConfig", (), {})
    _package("megatron.bridge.models.hybrid")
    _package("megatron.bridge.models.hybrid.hybrid_builder").HybridModelConfig = type("HybridModelConfig", (), {})
    _package("megatron.bridge.utils.common_utils").get_rank_safe = lambda: 0


def _versions(modules, torch_v: str, te_v: str) -> None:
    for mod in modules:
        for name, fn in (("is_torch_min_version", lambda v, check_equality=True: _at_least(torch_v, v)),
                         ("is_te_min_version", lambda v, check_equality=True: _at_least(te_v, v)),
                         ("get_te_version", lambda: te_v)):
            if hasattr(mod, name):
                setattr(mod, name, fn)


def main() -> None:
    _mount_bridge(Path(sys.argv[1]))
    cases = json.load(sys.stdin)
    warnings.simplefilter("ignore")
    import megatron.bridge.training.comm_overlap as co
    import megatron.bridge.training.flex_dispatcher_backend as fdb
    import megatron.bridge.training.mixed_precision as mp
    import megatron.core
    import torch
    from megatron.bridge.utils.cuda_graph import validate_cuda_graph_configuration
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import transformer_config as tc

    class Model(tc.TransformerConfig):
        """Bridge's model configs: a TransformerConfig whose __post_init__ waits for finalize()."""

        def __post_init__(self):
            pass

        def finalize(self):
            tc.TransformerConfig.__post_init__(self)

    logging.disable(logging.CRITICAL)  # Bridge's fallback warnings: the fields after apply say the same
    out = []
    for case in cases:
        _versions((tc, co, mp), case["torch"], case["te"])
        gpu = SimpleNamespace(name=case["gpu"]["name"], major=case["gpu"]["major"])
        visible = SimpleNamespace(value=not case.get("apply_without_gpu"))
        fdb.torch = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda _v=visible: _v.value,
                                                         get_device_properties=lambda _i, _g=gpu: _g))
        kwargs = dict(case["kwargs"])
        if kwargs.get("pipeline_dtype") == "bfloat16":
            kwargs["pipeline_dtype"] = torch.bfloat16
        stage, applied = "build", None
        try:
            model = Model(**kwargs)
            if case.get("apply_backend"):
                stage = "apply"
                fdb.apply_flex_dispatcher_backend(model, case["apply_backend"])
            visible.value = True  # the training node, where validation runs, has its GPU
            applied = [model.moe_token_dispatcher_type, model.moe_flex_dispatcher_backend,
                       model.moe_shared_expert_overlap]
            if case.get("mixed_precision"):
                stage = "mixed"
                recipe = mp.get_mixed_precision_config(case["mixed_precision"])
                recipe.finalize()
                recipe.setup(model, None, None)
            ddp = DistributedDataParallelConfig(**case["ddp"])
            if case.get("comm_overlap") is not None:
                stage = "comm"
                overlap = co.CommOverlapConfig(tp_comm_overlap=False, data_parallel_size=1, **case["comm_overlap"])
                overlap.finalize()
                overlap.setup(model, OptimizerConfig(), ddp)
            stage = "graphs"
            validate_cuda_graph_configuration(model)
            stage = "core"
            model.finalize()
            stage = "flex"
            fdb.validate_flex_dispatcher_backend(model)
        except Exception as exc:  # noqa: BLE001 - every rejection is reported, the caller sorts them out
            out.append([False, stage, type(exc).__name__, str(exc), applied])
        else:
            out.append([True, "", "", "", applied])
    json.dump({"version": getattr(megatron.core, "__version__", None), "core_file": tc.__file__,
               "bridge_file": co.__file__, "results": out}, sys.stdout)


if __name__ == "__main__":
    main()
