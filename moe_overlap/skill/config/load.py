"""Read a config file or text into a plain dict, turning every kind of bad input into one ConfigError.

Kept apart from the config model so the model file stays about fields, and so the fuzz tests can hit
the loader directly. Nothing here imports torch.

Bounded by construction, whatever the input (docs/limits.md):
- files: regular files only, opened once, at most MAX_BYTES read (skill/files.py);
- YAML: a first pass over the parser's events refuses anchors and aliases (an alias bomb expands a few lines into
  billions of nodes), more than MAX_NODES values and nesting deeper than MAX_DEPTH, before anything is built;
  a value the constructor cannot build (``!!int 0x``, ``2024-02-31``, a 5000-digit int) is a ConfigError with its
  line, never a traceback;
- values: finite floats only, integers within +-MAX_INT, only the types JSON has (dates become strings).
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from moe_overlap.skill.files import FileRefused, open_regular, read_limited_fd

MAX_BYTES = 1_000_000  # a training config is a few KB; anything this large is the wrong file
MAX_NODES = 20_000  # a full Megatron-Bridge ConfigContainer dump has about 1,500 values
MAX_DEPTH = 32
MAX_INT = 2**63 - 1  # Megatron's integers are C int64 at most
CONFIG_SUFFIXES = (".yaml", ".yml", ".json")

_CParser = getattr(yaml, "CParser", None)


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


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "somewhere"


class _Loader(yaml.CSafeLoader if _CParser is not None else yaml.SafeLoader):  # type: ignore[misc]
    """SafeLoader (libyaml's parser when present) that rejects a key given twice in one mapping (YAML silently
    keeps the last one) and turns any value its constructors cannot build into a ConfigError with the line."""

    def construct_object(self, node, deep=False):  # noqa: D102 - SafeConstructor's, wrapped
        try:
            return super().construct_object(node, deep=deep)
        except (ConfigError, yaml.YAMLError, RecursionError):
            raise
        except Exception as exc:  # noqa: BLE001 - ValueError, KeyError, AttributeError ... of a constructor
            tag = node.tag.rsplit(":", 1)[-1]
            # The project's words, never the constructor's (a Python internals string such as
            # "'NoneType' object has no attribute 'groupdict'" says nothing to the user).
            raise ConfigError(f"{_where(node.start_mark)}: this {tag} value cannot be read ({_why(tag, exc)})",
                              fix="write the value as a plain number, true/false or a quoted string") from None


def _why(tag: str, exc: Exception) -> str:
    if "digits" in str(exc):
        return "an integer of more than 4300 digits"
    return {"timestamp": "not a date or time YAML can read, e.g. 2024-02-01 or 2024-02-01T10:00:00",
            "int": "not an integer", "float": "not a number", "bool": "not true or false",
            "binary": "not base64 data"}.get(tag, f"not a valid {tag}")


def _construct_mapping(loader: _Loader, node: yaml.MappingNode, deep: bool = False) -> dict:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            hash(key)
        except TypeError:
            raise ConfigError(f"{_where(key_node.start_mark)}: a mapping key must be a plain string, "
                              f"got a {type(key).__name__}") from None
        if key in out:
            raise ConfigError(f"duplicate key {str(key)[:80]!r} at {_where(key_node.start_mark)}",
                              field=str(key)[:80], fix="keep only one of the two entries")
        out[key] = loader.construct_object(value_node, deep=deep)
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _check_events(text: str, name: str) -> None:
    """One pass over the parser's events: no anchor or alias, at most MAX_NODES values, MAX_DEPTH levels."""
    nodes = depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ConfigError(f"{name}: YAML anchors and aliases (&name / *name) are not accepted, at "
                              f"{_where(event.start_mark)}",
                              fix="write each value out in full (a config needs no references)")
        if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            nodes += 1
            if nodes > MAX_NODES:
                raise ConfigError(f"{name}: more than {MAX_NODES} values; this is not a training config",
                                  fix="give the training config itself")
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise ConfigError(f"{name}: nested more than {MAX_DEPTH} levels deep at {_where(event.start_mark)}; "
                                  "this is not a training config")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def check_values(data: Any, *, name: str = "config") -> Any:
    """A copy of `data` holding only JSON's types, or ConfigError naming the field: finite floats, integers
    within +-MAX_INT, string keys; at most MAX_NODES values, MAX_DEPTH levels (any dict handed in: MCP, Python)."""
    count = [0]

    def walk(value: Any, path: str, depth: int) -> Any:
        count[0] += 1
        if count[0] > MAX_NODES:
            raise ConfigError(f"{name}: more than {MAX_NODES} values; this is not a training config",
                              fix="give the training config itself")
        if depth > MAX_DEPTH:
            raise ConfigError(f"{name}: nested more than {MAX_DEPTH} levels deep (at {path or 'the top'})",
                              field=path or None)
        where = path or "the top level"
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            if abs(value) > MAX_INT:
                raise ConfigError(f"{where}: the integer is out of range (beyond +-(2**63 - 1))",
                                  field=path or None, fix="give a realistic value")
            return value
        if isinstance(value, float):
            if not math.isfinite(value):
                raise ConfigError(f"{where}: {value} is not a finite number", field=path or None,
                                  fix="give a finite number")
            return value
        if isinstance(value, (datetime.date, datetime.time)):
            return value.isoformat()  # YAML reads 2024-01-01 as a date; JSON has only strings
        if isinstance(value, Mapping):
            out = {}
            for key, item in value.items():
                if isinstance(key, bool) or not isinstance(key, (str, int, float)):
                    raise ConfigError(f"{where}: key {str(key)[:40]!r} is a {type(key).__name__}; keys must be "
                                      "strings", field=path or None, fix="quote the key")
                key = key if isinstance(key, str) else str(key)
                out[key] = walk(item, f"{path}.{key}" if path else key, depth + 1)
            return out
        if isinstance(value, (list, tuple)):
            return [walk(item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value)]
        raise ConfigError(f"{where}: a {type(value).__name__} value (YAML !!binary, !!set ...) is not accepted in "
                          "a config", field=path or None, fix="use a plain string, number, list or mapping")

    return walk(data, "", 0)


def _reject_duplicate_json_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ConfigError(f"duplicate key {key[:80]!r}", field=key[:80], fix="keep only one of the two entries")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ConfigError(f"{name} is not a number JSON allows", fix="give a finite number")


def _load_text(text: str, name: str, fmt: str | None) -> Any:
    try:
        if fmt == "json":
            return json.loads(text, object_pairs_hook=_reject_duplicate_json_keys, parse_constant=_no_constant)
        _check_events(text, name)
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except ConfigError:
        raise
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{name}: JSON syntax error at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f" at {_where(mark)}" if mark else ""
        raise ConfigError(f"{name}: YAML syntax error{where}: {exc.problem or exc.context}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {str(exc).splitlines()[0] if str(exc) else exc!r}") from None
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply to be a training config") from None
    except ValueError:  # json: an integer of more than 4300 digits
        raise ConfigError(f"{name}: a value cannot be read (an integer of more than 4300 digits)",
                          fix="give realistic numbers") from None


def parse_value(text: str, *, name: str = "value") -> Any:
    """One YAML scalar or small structure (a ``--set KEY=VALUE`` value), bounded like a whole config; text the
    YAML scanner refuses (``a: b``) stays the string it is."""
    if len(text) > MAX_BYTES:
        raise ConfigError(f"{name}: more than {MAX_BYTES // 1_000_000} MB", field=name)
    try:
        _check_events(text, name)
        value = yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError:
        return text
    except RecursionError:
        raise ConfigError(f"{name}: nested too deeply", field=name) from None
    except ConfigError as exc:
        raise ConfigError(exc.message, field=exc.field or name, fix=exc.fix) from None
    return check_values(value, name=name)


def parse_text(text: str, *, name: str = "<config>", fmt: str | None = None) -> dict[str, Any]:
    """YAML (or JSON, when `fmt` is "json") text -> a dict of JSON types; ConfigError on anything else."""
    if len(text) > MAX_BYTES or len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise ConfigError(f"{name}: more than {MAX_BYTES // 1_000_000} MB; this is not a training config")
    if "\x00" in text:
        raise ConfigError(f"{name}: contains NUL bytes; this is a binary file, not YAML or JSON")
    if not text.strip():
        raise ConfigError(f"{name}: empty config", fix="give at least a `model:` section")
    data = _load_text(text, name, fmt)
    if data is None:
        raise ConfigError(f"{name}: empty config (only comments)", fix="give at least a `model:` section")
    if not isinstance(data, dict):
        raise ConfigError(f"{name}: the top level must be a mapping of sections (model:, comm_overlap:, ddp:), "
                          f"got a {type(data).__name__}", fix="start the file with `model:`")
    return check_values(data, name=name)


def read_file(path: Path, *, recognised: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """A YAML or JSON file -> dict. Size, kind, encoding and syntax problems become ConfigError.

    The file policy (docs/limits.md): regular files only, at most MAX_BYTES. A file named ``*.yaml``, ``*.yml``
    or ``*.json`` is read as a config and its errors are reported in full. Any other file is read only when its
    content parses as a mapping that `recognised` accepts (it names a known section or field); otherwise it is
    refused with a message that quotes nothing of it, so that naming an unrelated file (``/etc/shadow``, a key)
    never echoes its content.
    """
    name = str(path)
    try:
        fd = open_regular(path, what="config file")
        try:
            raw = read_limited_fd(fd, MAX_BYTES, name=name, what="config file")
        finally:
            os.close(fd)
    except FileRefused as exc:
        raise ConfigError(exc.message, fix=exc.fix or "give a YAML or JSON config file") from None
    return parse_file_bytes(raw, name=name, suffix=Path(path).suffix, recognised=recognised)


def parse_file_bytes(raw: bytes, *, name: str, suffix: str,
                     recognised: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
    """The bytes of a config file named `name` (ending in `suffix`) -> dict, by read_file's policy."""
    if len(raw) > MAX_BYTES:
        raise ConfigError(f"{name}: more than {MAX_BYTES // 1_000_000} MB; this is not a training config")
    if b"\x00" in raw:
        raise ConfigError(f"{name}: binary file (NUL bytes), not YAML or JSON")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{name}: not UTF-8 text (bad byte at offset {exc.start}); binary file?") from None
    suffix = suffix.lower()
    if suffix in CONFIG_SUFFIXES:
        return parse_text(text, name=name, fmt="json" if suffix == ".json" else None)
    if not text.strip():
        raise ConfigError(f"{name}: empty config", fix="give at least a `model:` section")
    refused = ConfigError(
        f"{name}: not read as a training config: the name does not end in {', '.join(CONFIG_SUFFIXES)} and the "
        "content is not a YAML/JSON mapping with a known section (model:, comm_overlap:, ddp:, train:) or field",
        fix="give the YAML or JSON config file (rename it to .yaml if it is one)")
    try:  # the parser's own message may quote the content: never shown for a file that may not be a config
        data = parse_text(text, name=name)
    except ConfigError:
        raise refused from None
    if recognised is not None and not recognised(data):
        raise refused
    return data
