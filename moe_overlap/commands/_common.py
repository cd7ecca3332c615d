"""Shared pieces of the CLI commands: exit codes, errors, output in text/json/yaml."""

from __future__ import annotations

import json
import math
import sys
from typing import Any

EXIT_OK = 0
EXIT_FAIL = 1  # invalid config, verification failed
EXIT_USAGE = 2  # usage or input error


class CommandError(Exception):
    """An error the user can fix: printed as one clear message (never a traceback)."""

    def __init__(self, message: str, *, exit_code: int = EXIT_USAGE, field: str | None = None,
                 fix: str | None = None, choices: list[str] | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.field = field
        self.fix = fix
        self.choices = choices

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.message}
        if self.field:
            out["field"] = self.field
        if self.fix:
            out["fix"] = self.fix
        if self.choices:
            out["choices"] = self.choices
        return out


def add_format_argument(parser, choices=("text", "json")) -> None:
    parser.add_argument("--format", choices=list(choices), default="text",
                        help="output format (json prints one JSON document on stdout)")


def to_jsonable(obj: Any) -> Any:
    """pydantic models and dataclasses to plain JSON data."""
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="json")
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return obj


def strict(data: Any) -> Any:
    """`data` with every non-finite float replaced by None: `--format json` output is strict JSON (RFC 8259 has
    no NaN or Infinity, and many parsers refuse them). Inputs are range-checked, so this is a last guard."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: strict(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [strict(v) for v in data]
    return data


def dumps(data: Any, **kwargs: Any) -> str:
    try:
        return json.dumps(data, allow_nan=False, default=str, **kwargs)
    except ValueError:  # a NaN or Infinity somewhere
        return json.dumps(strict(data), allow_nan=False, default=str, **kwargs)


def emit(obj: Any, fmt: str, text: str | None = None) -> None:
    """Print `obj` as JSON/YAML, or `text` (defaults to a YAML rendering) for people."""
    data = to_jsonable(obj)
    if fmt == "json":
        sys.stdout.write(dumps(data, indent=2, sort_keys=False) + "\n")
    elif fmt == "yaml" or text is None:
        import yaml

        sys.stdout.write(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def print_error(exc: CommandError, fmt: str = "text") -> None:
    if fmt == "json":
        sys.stdout.write(dumps(exc.to_dict(), indent=2) + "\n")
        return
    lines = [f"error: {exc.message}"]
    if exc.fix:
        lines.append(f"fix: {exc.fix}")
    if exc.choices:
        lines.append("valid choices: " + ", ".join(exc.choices))
    print("\n".join(lines), file=sys.stderr)
