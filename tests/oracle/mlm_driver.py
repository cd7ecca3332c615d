"""Run inside a child Python whose sys.path starts with one megatron-core release that has megatron/training.

Reads a JSON list of cases from stdin, each {"argv": [...], "env": {...}, "te": "2.12.0", "torch": "2.6.0"}, and for
each runs that release's own Megatron-LM argument handling as ``pretrain_gpt.py`` does:
``parse_args -> validate_args -> core_transformer_config_from_args``. Prints one JSON document with
[accepted, exception type, message, derived] per case (derived: a few values Megatron-LM computed, e.g. the VPP
size), and the option strings of the release's parser. Standalone on purpose: it must not import moe_overlap (the child runs with the release's path).

What is stood in for, and why (nothing else is touched):
- ``megatron.training`` is entered as a bare package (its ``__init__`` imports the whole training loop: wandb,
  one-logger, data loaders); the submodules arguments.py needs import as they are.
- ``six``, ``regex`` (0.16.1's tokenizers import them at module level; never called here): empty modules if absent.
- Python 3.11 lacks ``typing.override`` (3.12), which 0.18+ imports: an identity decorator.
- The TE and torch version probes answer the case's versions (as tests/oracle/core_driver.py does), and
  ``torch.cuda.get_device_capability`` / ``get_device_properties`` answer an H100 (9.0): there is no GPU here, and
  the grouped-GEMM and Megatron-FSDP checks ask for one.
- TE's fused kernels that TransformerConfig asks for (``rope_utils.fused_*``: RoPE fusion, Megatron-LM's default;
  ``moe_utils.fused_*``: ``--moe-permute-fusion``) are placeholder functions: the TE the case names is installed.
- Environment variables (WORLD_SIZE, RANK, CUDA_DEVICE_MAX_CONNECTIONS) are set per case; no process group is made.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import sys
import types
import typing
import warnings


def _version(text: str) -> tuple[int, ...]:
    m = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?(.*)", text)
    major, minor, patch, rest = int(m.group(1)), int(m.group(2)), int(m.group(3) or 0), m.group(4)
    return (major, minor, patch, -1 if rest and rest[:1] in ("a", "b", "r", "d", ".") and "post" not in rest else 0)


def _at_least(have: str, need: str) -> bool:
    return _version(have) >= _version(need)


def _enter_training(root: str) -> types.ModuleType:
    if not hasattr(typing, "override"):
        typing.override = lambda f: f  # 3.12's decorator; it only marks a method
    import importlib.util

    for name in ("six", "regex"):  # imported at module level by tokenizers the argument checks never call (0.16.1)
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = types.ModuleType(name)
    import megatron

    pkg = types.ModuleType("megatron.training")
    pkg.__path__ = [os.path.join(root, "megatron", "training")]
    sys.modules["megatron.training"] = pkg
    megatron.training = pkg
    import megatron.training.global_vars as global_vars

    for name in dir(global_vars):  # what megatron/training/__init__.py re-exports and its submodules import
        if name.startswith(("get_", "set_")):
            setattr(pkg, name, getattr(global_vars, name))
    import megatron.training.arguments as arguments

    return arguments


def _patch_versions(modules: list, te: str, torch_v: str) -> None:
    for mod in modules:
        if hasattr(mod, "is_te_min_version"):
            mod.is_te_min_version = lambda v, check_equality=True, _t=te: _at_least(_t, v)
        if hasattr(mod, "get_te_version"):
            mod.get_te_version = lambda _t=te: _t
        if hasattr(mod, "is_torch_min_version"):
            mod.is_torch_min_version = lambda v, check_equality=True, _t=torch_v: _at_least(_t, v)


def main() -> None:
    cases = json.load(sys.stdin)
    root = sys.argv[1]
    warnings.simplefilter("ignore")
    with contextlib.redirect_stdout(io.StringIO()):
        arguments = _enter_training(root)
    import torch
    from megatron.core.transformer import transformer_config as tc

    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(major=9, minor=0, name="NVIDIA H100")
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.moe import moe_utils

    # TE's fused kernels TransformerConfig asks for (RoPE, permutation); 0.16.1 defines the names only with TE.
    te_kernels = {rope_utils: ("fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_thd"),
                  moe_utils: ("fused_permute", "fused_permute_with_probs", "fused_sort_chunks_by_index",
                              "fused_sort_chunks_by_index_with_probs", "fused_unpermute")}
    for mod, names in te_kernels.items():
        for name in names:
            if getattr(mod, name, None) is None:
                setattr(mod, name, lambda *a, **k: None)
    utils = sys.modules.get("megatron.training.argument_utils")
    to_config = getattr(arguments, "core_transformer_config_from_args", None) or utils.core_transformer_config_from_args
    modules = [m for m in (arguments, tc, utils, sys.modules.get("megatron.core.utils")) if m is not None]
    # Built once and handed to every parse_args (argparse parsers are not changed by parsing): building the
    # ~850-option parser is most of a case's time.
    import argparse

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(description="Megatron-LM Arguments",
                                                                      allow_abbrev=False))
    arguments.add_megatron_arguments = lambda _parser: parser
    base_env = dict(os.environ)
    out = []
    for case in cases:
        _patch_versions(modules, case["te"], case["torch"])
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(case["env"])
        if "CUDA_DEVICE_MAX_CONNECTIONS" not in case["env"]:
            os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
        sys.argv = ["pretrain_gpt.py", *case["argv"]]
        derived: dict = {}
        err = io.StringIO()
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                args = arguments.parse_args()
                arguments.validate_args(args, {})
                derived = {"vpp": args.virtual_pipeline_model_parallel_size,
                           "gradient_accumulation_fusion": args.gradient_accumulation_fusion}
                to_config(args)
        except SystemExit as exc:  # argparse: an unknown flag or a bad value
            last = (err.getvalue().strip().splitlines() or [""])[-1]
            out.append([False, "SystemExit", f"argparse exit {exc.code}: {last[:400]}", derived])
        except Exception as exc:  # noqa: BLE001 - every rejection is reported, the caller sorts them out
            out.append([False, type(exc).__name__, str(exc)[:500], derived])
        else:
            out.append([True, "", "", derived])
    flags = sorted(o for a in parser._actions for o in a.option_strings)
    json.dump({"file": arguments.__file__, "core_file": tc.__file__, "flags": flags, "results": out}, sys.stdout)


if __name__ == "__main__":
    main()
