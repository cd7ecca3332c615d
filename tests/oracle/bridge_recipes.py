"""Read a Megatron-Bridge recipe's settings from the unpacked 0.6.2 wheel, without importing it.

Bridge is never imported here (it needs torch, transformers and a Hugging Face download to build a recipe); its
recipe functions are plain assignment lists, so this walks their syntax trees instead: ``cfg = other_recipe()``
is followed into the other function (through the module's imports), ``helper(cfg)`` / ``helper(cfg.model, ...)``
into the helper's body with its literal arguments bound, ``cfg.section.key = literal`` is recorded,
``cfg.comm_overlap = CommOverlapConfig(k=v, ...)`` replaces that section, and
``set_deepseek_v3_pipeline_model_parallel_layout(cfg.model, "layout")`` records the explicit layout. Branches
(``if``) are not evaluated: a value set only inside one is not reported. What is read is what the recipe file
says, so a test comparing against it uses upstream as the oracle.

    python -m tests.oracle.bridge_recipes megatron.bridge.perf_recipes.qwen.h100.qwen3_moe \
        qwen3_30b_a3b_pretrain_16gpu_h100_bf16_config
"""

from __future__ import annotations

import ast
import json
import sys
from functools import cache
from pathlib import Path
from typing import Any

from tests.oracle.fetch import bridge_dir

LAYOUT_SETTER = "set_deepseek_v3_pipeline_model_parallel_layout"


def module_path(module: str) -> Path:
    return bridge_dir() / (module.replace(".", "/") + ".py")


@cache
def _module(module: str) -> tuple[dict[str, ast.FunctionDef], dict[str, tuple[str, str]]]:
    tree = ast.parse(module_path(module).read_text(encoding="utf-8"))
    funcs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    imports = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("megatron.bridge"):
            for alias in node.names:
                imports[alias.asname or alias.name] = (node.module, alias.name)
    return funcs, imports


def _resolve(module: str, name: str) -> tuple[str, ast.FunctionDef] | None:
    funcs, imports = _module(module)
    if name in funcs:
        return module, funcs[name]
    if name in imports:
        target_module, target_name = imports[name]
        if module_path(target_module).is_file():
            return _resolve(target_module, target_name)
    return None


def _attr_path(node: ast.AST) -> list[str] | None:
    """`cfg.model.x` -> ["cfg", "model", "x"]."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def _value(node: ast.AST, env: dict[str, Any]) -> Any:
    if isinstance(node, ast.Name) and node.id in env and not isinstance(env[node.id], _Ref):
        return env[node.id]
    if isinstance(node, ast.Dict):  # env_vars: {**COMMON_PERF_ENV_VARS, "KEY": value, ...}: the literal entries
        return {ast.literal_eval(k): _value(v, env) for k, v in zip(node.keys, node.values, strict=True) if k is not None}
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)  # e.g. torch.bfloat16, bf16_mixed(): kept as text


class _Ref:
    """A name bound to a part of the config: `prefix` is the section path ([] = the whole cfg)."""

    def __init__(self, prefix: list[str]):
        self.prefix = prefix


def _run(module: str, fn: ast.FunctionDef, env: dict[str, Any], out: dict[str, Any], depth: int = 0) -> None:
    if depth > 12:
        raise RecursionError(f"recipe call chain too deep at {fn.name}")
    for stmt in fn.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            _assign(module, stmt.targets[0], stmt.value, env, out, depth)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            _call(module, stmt.value, env, out, depth)


def _assign(module: str, target: ast.AST, value: ast.AST, env: dict[str, Any], out: dict[str, Any],
            depth: int) -> None:
    if isinstance(target, ast.Name) and isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
        found = _resolve(module, value.func.id)
        if found is not None and _returns_cfg(found[1]):
            _run(found[0], found[1], _bind(module, found[1], value, env, out, depth) | {"cfg": _Ref([])}, out,
                 depth + 1)
            env[target.id] = _Ref([])
        return
    path = _attr_path(target)
    if not path or path[0] not in env or not isinstance(env[path[0]], _Ref):
        return
    key = ".".join(env[path[0]].prefix + path[1:])
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "CommOverlapConfig":
        for k in [k for k in out if k.startswith(key + ".")]:
            del out[k]
        out.update({f"{key}.{kw.arg}": _value(kw.value, env) for kw in value.keywords})
        return
    src = _attr_path(value)
    if src and src[0] in env and isinstance(env[src[0]], _Ref):
        out[key] = out.get(".".join(env[src[0]].prefix + src[1:]))
        return
    out[key] = _value(value, env)


def _returns_cfg(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Return) and isinstance(n.value, ast.Name) for n in ast.walk(fn))


def _bind(module: str, fn: ast.FunctionDef, call: ast.Call, env: dict[str, Any], out: dict[str, Any],
          depth: int) -> dict[str, Any]:
    names = [a.arg for a in fn.args.args]
    bound: dict[str, Any] = {}
    defaults = fn.args.defaults
    for name, default in zip(names[len(names) - len(defaults):], defaults, strict=True):
        bound[name] = _value(default, env)
    for name, arg in zip(names, call.args, strict=False):
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Name):  # helper(other_recipe(), ...)
            inner = _resolve(module, arg.func.id)
            if inner is not None and _returns_cfg(inner[1]):
                _run(inner[0], inner[1], _bind(module, inner[1], arg, env, out, depth) | {"cfg": _Ref([])}, out,
                     depth + 1)
                bound[name] = _Ref([])
                continue
        path = _attr_path(arg)
        if path and path[0] in env and isinstance(env[path[0]], _Ref):
            bound[name] = _Ref(env[path[0]].prefix + path[1:])
        else:
            bound[name] = _value(arg, env)
    for kw in call.keywords:
        if kw.arg:
            bound[kw.arg] = _value(kw.value, env)
    return bound


def _call(module: str, call: ast.Call, env: dict[str, Any], out: dict[str, Any], depth: int) -> None:
    if not isinstance(call.func, ast.Name):
        return
    name = call.func.id
    found = _resolve(module, name)
    if found is None:
        return
    bound = _bind(module, found[1], call, env, out, depth)
    if found[1].name == LAYOUT_SETTER:
        layout = bound.get("layout")
        out["model.pipeline_model_parallel_layout"] = layout if layout is not None else "default-layout-map"
        return
    if any(isinstance(v, _Ref) for v in bound.values()):
        _run(found[0], found[1], bound, out, depth + 1)


def read_recipe(module: str, function: str) -> dict[str, Any]:
    """{"model.tensor_model_parallel_size": 2, "comm_overlap.delay_wgrad_compute": True, ...} of one recipe."""
    found = _resolve(module, function)
    if found is None:
        raise KeyError(f"{function} not found in {module_path(module)}")
    out: dict[str, Any] = {}
    _run(found[0], found[1], {}, out)
    return out


if __name__ == "__main__":
    json.dump(read_recipe(sys.argv[1], sys.argv[2]), sys.stdout, indent=1, default=str)
    print()
