"""Results name MCP tools, not CLI commands, where a tool does the job.

The knowledge (card, rule fixes, generated checks, diagnosis hints) is written once, for people and
scripts, and names `moe-overlap` commands: "run `moe-overlap validate CONFIG`". An assistant connected
over MCP cannot run them, and should call `validate_config` instead. `mcp_wording` rewrites every such
command in a result into the tool call that does the same job, its arguments read with the command's
own argparse parser: `moe-overlap validate x.yaml --torch-version 2.6.0` becomes
`validate_config(config="x.yaml", torch_version="2.6.0")`. Commands no tool can do (`verify --judge`,
`verify --print-launch`, `estimate --calibrate`) stay as they are. Torch-free.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from functools import cache
from typing import Any

TOOLS = {"validate": "validate_config", "generate": "generate_config", "verify": "run_verification",
         "check-logs": "check_training_log", "diagnose": "diagnose_failure", "estimate": "estimate_overlap_benefit",
         "card": "get_skill_card"}
COMMAND = re.compile(r"(?:\b(?P<verb>[Rr]un|[Uu]se) )?(?P<open>`?)moe-overlap (?P<sub>"
                     + "|".join(map(re.escape, TOOLS)) + r")\b(?P<rest>[^`\n]*)(?P<close>`?)")
# CLI option -> MCP argument, per command (None: the option has no MCP counterpart and is dropped).
RENAMES: dict[str, dict[str, str | None]] = {
    "validate": {"format": None},
    "generate": {"format": None},
    "verify": {"timeout": "timeout_s", "hang_timeout": None, "out": None, "force": None, "quiet": None,
               "format": None, "inject_fault": None, "no_explain": None},
    "check-logs": {"log": "path", "expect_overlap": None, "expect_delay_wgrad": None, "format": None},
    "diagnose": {"skill": None, "format": None},
    "estimate": {"format": None, "calibrate_backend": None},
    "card": {"format": None},
}
NO_TOOL = {"verify": ("judge", "print_launch"), "estimate": ("calibrate",)}  # only the CLI does these
_STOP = re.compile(r"^(&&|\|\||\||;|>|<|\d?>)")
_TRAIL = ".,;:)]'"
_REDIRECT = re.compile(r"(\b[a-z_]+\([^()]*\)) > (\S+) && ")


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise _Refused(message)

    def exit(self, status: int = 0, message: str | None = None):  # type: ignore[override]
        raise _Refused(message or "exit")


@cache
def _parser(sub: str) -> _Parser:
    from moe_overlap.cli import _module_for

    parser = _Parser(prog=f"moe-overlap {sub}", add_help=False)
    _module_for(sub).add_arguments(parser)
    return parser


def _takes_value(parser: argparse.ArgumentParser, flag: str) -> bool:
    action = parser._option_string_actions.get(flag.split("=", 1)[0])  # noqa: SLF001 - argparse has no API
    return action is not None and action.nargs != 0 and "=" not in flag


def _looks_like_argument(sub: str, token: str) -> bool:
    """A positional the sentence gives the command: a path, a quoted text, a placeholder like CONFIG, or
    (for `card`) a skill name."""
    return bool(token[:1] in "\"'" or "/" in token or re.search(r"\.[A-Za-z]{2,5}$", token)
                or re.fullmatch(r"[A-Z][A-Z_]*", token) or token == "-"
                or (sub == "card" and re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)+", token)))


def _split(sub: str, rest: str) -> tuple[list[str], str]:
    """The tokens of `rest` that belong to the command, and the text after them."""
    taken: list[str] = []
    pos = 0
    pending_value = False
    for m in re.finditer(r"\"[^\"]*\"|'[^']*'|\S+", rest):
        token = m.group(0)
        if _STOP.match(token):
            break
        core = token.rstrip(_TRAIL) if token[:1] not in "\"'" else token
        if pending_value or core.startswith("-") or _looks_like_argument(sub, core):
            pending_value = False
            taken.append(core)
            pos = m.start() + len(core)
            if core.startswith("--"):
                pending_value = True  # decided against the parser in `_call`; an extra token is dropped there
            if core != token:
                break  # punctuation ends the command
        else:
            break
    return taken, rest[pos:]


def _value(text: Any) -> str:
    if isinstance(text, str) and re.fullmatch(r"[A-Z][A-Z_]*", text):
        return f"<{text}>"  # a placeholder the reader fills in
    return json.dumps(text, ensure_ascii=False)


def _call(sub: str, tokens: list[str]) -> tuple[str, int] | None:
    """(the tool call, tokens used) for `moe-overlap sub tokens`, or None when no tool does it."""
    parser = _parser(sub)
    used = []
    i = 0
    while i < len(tokens):  # flags take a value only when the parser says so
        used.append(tokens[i])
        if tokens[i].startswith("--") and _takes_value(parser, tokens[i]) and i + 1 < len(tokens):
            used.append(tokens[i + 1])
            i += 1
        elif tokens[i].startswith("--") and i + 1 < len(tokens) and not tokens[i + 1].startswith("-") \
                and not _takes_value(parser, tokens[i]):
            break  # a value after a switch is the sentence going on
        i += 1
    argv = [shlex.split(t)[0] if t[:1] in "\"'" else t for t in used]
    if argv and argv[-1].startswith("--") and _takes_value(parser, argv[-1]):
        argv.append(argv[-1][2:].replace("-", "_").upper())  # "use --te-version": a value to fill in
    try:
        ns, extra = parser.parse_known_args(argv)
    except _Refused:
        return f"{TOOLS[sub]}", 0
    if any(getattr(ns, name, None) for name in NO_TOOL.get(sub, ())):
        return None
    args: dict[str, Any] = {}
    for name, value in vars(ns).items():
        target = RENAMES.get(sub, {}).get(name, name)
        if target is None or value in (None, [], False) or value == parser.get_default(name):
            continue
        if sub == "verify" and name == "modes":
            value = [m.strip() for m in str(value).split(",") if m.strip()]
        if sub == "estimate" and name == "link_gbps":
            args["intra_gbps"] = args["inter_gbps"] = value
            continue
        args[target] = value
    tool = "list_skills" if sub == "card" and "name" not in args else TOOLS[sub]
    if not args:
        return tool, len(used) - len(extra)
    return tool + "(" + ", ".join(f"{k}={_value(v)}" for k, v in args.items()) + ")", len(used) - len(extra)


def mcp_wording(text: str) -> str:
    """`text` with every `moe-overlap` command that a tool can do replaced by that tool's call."""
    if "moe-overlap " not in text:
        return text
    out, pos = [], 0
    while (m := COMMAND.search(text, pos)) is not None:
        sub, rest = m.group("sub"), m.group("rest")
        tokens, _ = _split(sub, rest)
        if {"--help", "-h"} & set(tokens):
            out.append(text[pos:m.start()] + f"the input schema of {TOOLS[sub]}")
            pos = m.end()
            continue
        call = _call(sub, tokens)
        if call is None:  # no tool does this: the command stays
            out.append(text[pos:m.end()])
            pos = m.end()
            continue
        rendered, used = call
        # Where the command ends in the text: after the last token the parser used.
        end = m.start("rest")
        for token in tokens[:used]:
            end = text.index(token, end) + len(token)
        verb = m.group("verb")
        verb = "" if not verb else ("Call " if verb[0].isupper() else "call ")
        out.append(text[pos:m.start()] + verb + m.group("open") + rendered)
        pos = end
    out.append(text[pos:])
    # "tool(...) > x.yaml && next(...)": a shell redirect means nothing to a tool call.
    return _REDIRECT.sub(r"\1, saved as \2; then ", "".join(out))


def flags_as_arguments(text: str, sub: str) -> str:
    """`--steps 4` / `--device cuda` of command `sub`, said in a text about that command, as the tool's
    arguments (`steps=4`, `device="cuda"`). Only options the tool takes are touched: Megatron-LM flags and
    CLI-only options (`--judge`, `--out`) stay. Commands in the text become tool calls first."""
    text = mcp_wording(text)
    if "--" not in text:
        return text
    parser = _parser(sub)
    from moe_overlap.mcp import catalog

    accepted = set(catalog.input_schema(TOOLS[sub]).get("properties", {}))

    def one(m: re.Match) -> str:
        action = parser._option_string_actions.get(m.group(1))  # noqa: SLF001 - argparse has no API
        if action is None:
            return m.group(0)
        target = RENAMES.get(sub, {}).get(action.dest, action.dest)
        if target is None or target not in accepted:
            return m.group(0)
        if action.nargs == 0:
            return f"{target}=true"
        value = m.group(2)
        if value is None:
            return target
        try:
            value = action.type(value) if action.type else value
        except (TypeError, ValueError):
            return m.group(0)
        return f"{target}={_value(value)}"

    return re.sub(r"(--[a-z][a-z0-9-]*)(?:[ =]([\w.+-]*\w))?", one, text)


def reword(data: Any) -> Any:
    """Every string inside JSON data passed through `mcp_wording` (a new structure; `data` is not changed)."""
    if isinstance(data, str):
        return mcp_wording(data)
    if isinstance(data, list):
        return [reword(x) for x in data]
    if isinstance(data, dict):
        return {k: reword(v) for k, v in data.items()}
    return data
