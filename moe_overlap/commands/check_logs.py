"""`moe-overlap check-logs LOG`: confirm the effective overlap config in a training log (ours, Megatron-LM or
Megatron-Bridge) and the absence of assertion errors, tracebacks, NCCL errors and hangs (exit 0 ok / 1 not)."""

from __future__ import annotations

from pathlib import Path

from moe_overlap.commands._common import EXIT_FAIL, EXIT_OK, CommandError, add_format_argument, emit

_EXPECT = {"true": True, "false": False, "any": None}


def add_arguments(parser) -> None:
    parser.add_argument("log", help="training log file ('-' reads stdin)")
    parser.add_argument("--expect-overlap", choices=list(_EXPECT), default="true",
                        help="value overlap_moe_expert_parallel_comm must have (default true)")
    parser.add_argument("--expect-delay-wgrad", choices=list(_EXPECT), default="any",
                        help="value delay_wgrad_compute must have (default: only report it)")
    add_format_argument(parser)


def _render(res) -> str:
    lines = [f"log check: {'OK' if res.ok else 'FAILED'} ({res.format} log, {res.lines} lines)"]
    for c in res.checks:
        where = f" (line {c.line})" if c.line else ""
        lines.append(f"  [{c.status.upper():4}] {c.id}: {c.message}{where}")
    return "\n".join(lines)


def _read_log(path: Path) -> str:
    if path.is_dir():
        raise CommandError(f"{path}: is a directory, not a log file", field="LOG")
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise CommandError(f"log file not found: {path}", field="LOG") from None
    except OSError as exc:
        raise CommandError(f"{path}: cannot read ({exc.strerror or exc})", field="LOG") from None
    # A log cut short by a node crash can end in NUL padding, and is exactly what needs checking: only NULs
    # before that tail (in the head, as grep looks) mean the wrong file (a checkpoint, a core dump).
    raw = raw.rstrip(b"\x00")
    if b"\x00" in raw[:8192]:
        raise CommandError(f"{path}: binary file (NUL bytes), not a text log", field="LOG")
    # Logs mix encodings (progress bars, locale output): undecodable bytes must not stop the check.
    return raw.decode("utf-8", errors="replace")


def run(args) -> int:
    import sys

    from moe_overlap.skill.diagnose.logs import check_training_log

    text = sys.stdin.read() if args.log == "-" else _read_log(Path(args.log))
    if not text.strip():
        raise CommandError(f"{args.log}: the log is empty, nothing to check", field="LOG",
                           fix="give the training log (stdout/stderr of rank 0)")
    res = check_training_log(text, expect_overlap=_EXPECT[args.expect_overlap],
                             expect_delay_wgrad=_EXPECT[args.expect_delay_wgrad])
    emit(res, args.format, _render(res))
    return EXIT_OK if res.ok else EXIT_FAIL
