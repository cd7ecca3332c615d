"""Shared pieces of the CLI commands: exit codes, errors, output in text/json/yaml.

`--format json` prints one result model per command, the same model (and the same compact spelling) the
MCP server returns for the same job, so a script and an assistant read the same shape.
"""

from __future__ import annotations

import sys
from typing import Any

from moe_overlap.jsonout import compact_json, finite, json_data

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


def emit(obj: Any, fmt: str, text: str | None = None) -> None:
    """Print `obj` as JSON (compact, the same as the MCP server's result: jsonout), YAML, or `text` (defaults
    to a YAML rendering) for people."""
    data = json_data(obj)
    if fmt == "json":
        sys.stdout.write(compact_json(data) + "\n")
    elif fmt == "yaml" or text is None:
        import yaml

        sys.stdout.write(yaml.safe_dump(finite(data), sort_keys=False, allow_unicode=True))
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")


def print_error(exc: CommandError, fmt: str = "text") -> None:
    if fmt == "json":
        sys.stdout.write(compact_json(exc.to_dict()) + "\n")
        return
    lines = [f"error: {exc.message}"]
    if exc.fix:
        lines.append(f"fix: {exc.fix}")
    if exc.choices:
        lines.append("valid choices: " + ", ".join(exc.choices))
    print("\n".join(lines), file=sys.stderr)
