"""Read a config file or text into a plain dict, turning every kind of bad input into one ConfigError.

Kept apart from the config model so the model file stays about fields, and so the fuzz tests can hit
the loader directly. Nothing here imports torch.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1_000_000  # a training config is a few KB; anything this large is the wrong file


class ConfigError(Exception):
    """Bad config input: one message naming the field (or the line) and, where possible, the fix."""

    def __init__(self, message: str, *, field: str | None = None, fix: str | None = None,
                 choices: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.field = field
        self.fix = fix
        self.choices = choices

    def __str__(self) -> str:
        return self.message


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that rejects a key given twice in one mapping (YAML silently keeps the last one)."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise ConfigError(f"line {key_node.start_mark.line + 1}: a mapping key must be a plain string, "
                              f"got a {type(key).__name__}") from None
        if key in out:
            mark = key_node.start_mark
            raise ConfigError(f"duplicate key {key!r} at line {mark.line + 1}, column {mark.column + 1}",
                              field=str(key), fix="keep only one of the two entries")
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _reject_duplicate_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"duplicate key {key!r}", field=key, fix="keep only one of the two entries")
        out[key] = value
    return out


def parse_text(text: str, *, name: str = "<config>", fmt: str | None = None) -> dict[str, Any]:
    """YAML (or JSON, when `fmt` is "json") text -> a dict; ConfigError on anything else."""
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise ConfigError(f"{name}: more than {MAX_BYTES // 1_000_000} MB; this is not a training config")
    if "\x00" in text:
        raise ConfigError(f"{name}: contains NUL bytes; this is a binary file, not YAML or JSON")
    if not text.strip():
        raise ConfigError(f"{name}: empty config", fix="give at least a `model:` section")
    try:
        if fmt == "json":
            data = json.loads(text, object_pairs_hook=_reject_duplicate_json_keys)
        else:
            data = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - SafeLoader subclass
    except ConfigError:
        raise
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name}: JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"{name}: YAML syntax error{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply to be a training config") from None
    if data is None:
        raise ConfigError(f"{name}: empty config (only comments)", fix="give at least a `model:` section")
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: the top level must be a mapping of sections (model:, comm_overlap:, ddp:), "
                          f"got a {type(data).__name__}", fix="start the file with `model:`")
    return data


def read_file(path: Path) -> dict[str, Any]:
    """A YAML or JSON file -> dict. Size, encoding and syntax problems become ConfigError."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a config file")
    if size > MAX_BYTES:
        raise ConfigError(f"{path}: {size} bytes, over the {MAX_BYTES // 1_000_000} MB limit; "
                          "this is not a training config")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    if b"\x00" in raw:
        raise ConfigError(f"{path}: binary file (NUL bytes), not YAML or JSON")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (bad byte at offset {exc.start}); binary file?") from None
    return parse_text(text, name=str(path), fmt="json" if path.suffix.lower() == ".json" else None)
