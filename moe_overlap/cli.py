"""`moe-overlap` command line: argparse wiring only.

Each sub-command lives in ``moe_overlap/commands/<name>.py`` with two functions:
``add_arguments(parser)`` and ``run(args) -> int``. Logic stays in ``skill/``, ``verify/`` and ``ep/``.

Exit codes (a contract scripts rely on): 0 ok / valid, 1 invalid or verification failed,
2 usage or input error. ``--format json`` prints exactly one JSON document on stdout. A stdout closed by the
reader (``moe-overlap card | head -0``) ends quietly with 141, the status of a process ended by SIGPIPE.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import sys

from moe_overlap import __version__
from moe_overlap.commands._common import EXIT_USAGE, CommandError, print_error
from moe_overlap.jsonout import compact_json

# name -> one-line help. Modules are imported lazily so `moe-overlap validate` never pays for torch.
COMMANDS: dict[str, str] = {
    "card": "print a skill card, or one field of it",
    "validate": "validate an EP-overlap training config against every constraint",
    "generate": "generate a minimal working EP-overlap config, or a staged rollout plan",
    "verify": "run A/B verification runs (baseline, overlap, overlap+wgrad) of the included MoE implementation",
    "check-logs": "check a training log for the effective overlap config and failures",
    "diagnose": "match an error message or symptom to known failure modes",
    "estimate": "predict the benefit of EP overlap for a shape and fabric",
}


class _UsageError(Exception):
    def __init__(self, parser: argparse.ArgumentParser, message: str):
        super().__init__(message)
        self.parser, self.message = parser, message


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is raised (not printed and exited) so that `--format json` gets it as JSON too."""

    def error(self, message: str):  # type: ignore[override]
        raise _UsageError(self, message)


def _wants_json(argv: list[str]) -> bool:
    return any(a == "--format=json" or (a == "--format" and b == "json") for a, b in zip(argv, [*argv[1:], ""], strict=True))


def _module_for(name: str):
    return importlib.import_module(f"moe_overlap.commands.{name.replace('-', '_')}")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = _Parser(prog="moe-overlap", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"moe-overlap {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, help_text in COMMANDS.items():
        if only is not None and name != only:
            # Registered without arguments so `--help` lists it; its real parser is built on use.
            sub.add_parser(name, help=help_text, add_help=False)
            continue
        p = sub.add_parser(name, help=help_text, description=help_text)
        _module_for(name).add_arguments(p)
    return parser


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell shows for a writer whose reader went away


def main(argv: list[str] | None = None) -> int:
    try:
        code = _main(argv)
        sys.stdout.flush()  # here, not at interpreter exit: a closed pipe is then caught below
        return code
    except BrokenPipeError:
        # The reader is gone: nothing more can be said to it. Point stdout at /dev/null so the interpreter's
        # own flush at exit does not print an "Exception ignored" message either.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Only the chosen command's module is imported (keeps start-up fast and torch-free).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    only = chosen if chosen in COMMANDS else None
    parser = build_parser(only)
    wants_json = _wants_json(argv)
    shown = io.StringIO()
    try:
        # --help / --version print on stdout and exit: with --format json that text becomes one JSON document.
        with contextlib.redirect_stdout(shown) if wants_json else contextlib.nullcontext():
            args = parser.parse_args(argv)
    except _UsageError as exc:
        exc.parser.print_usage(sys.stderr)
        print(f"{exc.parser.prog}: error: {exc.message}", file=sys.stderr)
        if _wants_json(argv):
            print_error(CommandError(exc.message, fix=f"see `{exc.parser.prog} --help`"), "json")
        return EXIT_USAGE
    except SystemExit as exc:  # --help, --version
        if wants_json:
            sys.stdout.write(compact_json({"help": shown.getvalue()}) + "\n")
        return EXIT_USAGE if exc.code not in (0, None) else 0
    if not args.command:
        parser.print_help(sys.stderr)
        if wants_json:
            print_error(CommandError("no command given", fix=f"one of: {', '.join(COMMANDS)}"), "json")
        return EXIT_USAGE
    try:
        return int(_module_for(args.command).run(args))
    except CommandError as exc:
        print_error(exc, getattr(args, "format", "text"))
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
