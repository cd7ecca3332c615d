"""Load a YAML or JSON data file and validate it, reporting problems as file:line:column plus JSON path.

Why positions matter: the card and evals files are edited by hand; "field required" without a line
number sends people hunting through a 700-line YAML file. PyYAML's node tree keeps the start mark of
every key and value, and JSON is (for these files) valid YAML, so one walker locates both formats.
Torch-free.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)
JsonPath = Sequence[str | int]


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a data file."""

    file: str
    line: int | None
    column: int | None
    path: str
    message: str

    def __str__(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
        return f"{where}: {self.path}: {self.message}"


class DocumentError(ValueError):
    """A data file that cannot be read or does not validate; `problems` lists every issue found."""

    def __init__(self, problems: list[Problem]):
        self.problems = problems
        head = f"{len(problems)} problem(s) in {problems[0].file}" if problems else "invalid document"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in problems))


def json_path(path: JsonPath) -> str:
    out = "$"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


# libyaml when present: the card loads about 10x faster (it is read on every MCP card request).
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _compose_construct(text: str) -> tuple[yaml.Node | None, Any]:
    """One parse gives both the node tree (positions) and the data."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        return node, (loader.construct_document(node) if node is not None else None)
    finally:
        loader.dispose()


def _compose(text: str) -> yaml.Node | None:
    try:
        return _compose_construct(text)[0]
    except yaml.YAMLError:
        return None  # positions are a convenience; the parse error itself is reported by parse()


def locate(node: yaml.Node | None, path: JsonPath) -> tuple[int, int] | None:
    """1-based (line, column) of the value at `path`, or of the deepest ancestor that exists.

    The last element of a mapping path points at its key, so "unexpected key" errors land on that key.
    """
    best = None if node is None else node.start_mark
    for i, part in enumerate(path):
        if isinstance(node, yaml.MappingNode):
            match = next(((k, v) for k, v in node.value if k.value == str(part)), None)
            if match is None:
                break
            key, node = match
            best = key.start_mark if i == len(path) - 1 else node.start_mark
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            node = node.value[part]
            best = node.start_mark
        else:
            break
    return None if best is None else (best.line + 1, best.column + 1)


def _duplicate_keys(node: yaml.Node | None, path: tuple[str | int, ...] = ()) -> list[tuple[tuple, yaml.Node]]:
    """Keys that appear twice in one mapping: YAML keeps the last silently, which hides edits."""
    found: list[tuple[tuple, yaml.Node]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if key.value in seen:
                found.append(((*path, key.value), key))
            seen.add(key.value)
            found += _duplicate_keys(value, (*path, key.value))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            found += _duplicate_keys(item, (*path, i))
    return found


def parse(path: Path) -> tuple[Any, yaml.Node | None]:
    """Read `path` (YAML, or JSON when it ends in .json); raise DocumentError on a syntax error."""
    name = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DocumentError([Problem(name, None, None, "$", f"cannot read file: {exc.strerror or exc}")]) from None
    tree: yaml.Node | None = None
    try:
        if path.suffix == ".json":
            data = json.loads(text)
            tree = _compose(text)
        else:
            tree, data = _compose_construct(text)
    except json.JSONDecodeError as exc:
        raise DocumentError([Problem(name, exc.lineno, exc.colno, "$", f"JSON syntax error: {exc.msg}")]) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line, col = (mark.line + 1, mark.column + 1) if mark else (None, None)
        msg = " ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None)) if p)
        raise DocumentError([Problem(name, line, col, "$", f"YAML syntax error: {msg or exc}")]) from None
    dups = _duplicate_keys(tree)
    if dups:
        raise DocumentError([
            Problem(name, key.start_mark.line + 1, key.start_mark.column + 1, json_path(p), "duplicate key")
            for p, key in dups
        ])
    return data, tree


def _schema_problems(name: str, data: Any, tree: yaml.Node | None, schema: dict) -> list[Problem]:
    from jsonschema import Draft202012Validator

    out: list[Problem] = []
    for err in Draft202012Validator(schema).iter_errors(data):
        path = list(err.absolute_path)
        if err.validator == "additionalProperties" and isinstance(err.instance, dict):
            allowed = set(err.schema.get("properties", {}))
            extra = sorted(k for k in err.instance if k not in allowed)
            if extra:
                path.append(extra[0])
        pos = locate(tree, path)
        msg = err.message if len(err.message) < 300 else err.message[:297] + "..."
        out.append(Problem(name, *(pos or (None, None)), json_path(path), msg))
    return sorted(out, key=lambda p: (p.line or 0, p.path))


def _pydantic_problems(name: str, tree: yaml.Node | None, exc: ValidationError) -> list[Problem]:
    out = []
    for e in exc.errors():
        path = [p for p in e["loc"] if isinstance(p, str | int)]
        pos = locate(tree, path)
        out.append(Problem(name, *(pos or (None, None)), json_path(path), e["msg"]))
    return out


def load_model(
    path: Path,
    model: type[M],
    *,
    schema: dict | None = None,
    extra_checks: Callable[[M], list[tuple[JsonPath, str]]] | None = None,
) -> M:
    """Parse `path`, validate against `schema` (JSON Schema) then `model`, then `extra_checks`.

    Every failure raises DocumentError whose problems carry file, line, column and JSON path.
    """
    name = str(path)
    data, tree = parse(path)
    if schema is not None:
        problems = _schema_problems(name, data, tree, schema)
        if problems:
            raise DocumentError(problems)
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        raise DocumentError(_pydantic_problems(name, tree, exc)) from None
    if extra_checks is not None:
        problems = [Problem(name, *(locate(tree, p) or (None, None)), json_path(p), msg)
                    for p, msg in extra_checks(obj)]
        if problems:
            raise DocumentError(problems)
    return obj
