"""`moe-overlap check-logs LOG`: confirm the effective overlap config in a training log (ours, Megatron-LM or
Megatron-Bridge) and the absence of assertion errors, tracebacks, NCCL errors and hangs (exit 0 ok / 1 not)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from moe_overlap.commands._common import EXIT_FAIL, EXIT_OK, CommandError, add_format_argument, emit

_EXPECT = {"true": True, "false": False, "any": None}
# A file larger than this is read in part: its first eighth and the rest from its end (the effective config is
# logged at the start, the failure at the end); the scan stays a few seconds at most (docs/limits.md).
MAX_LOG_BYTES = 16 << 20
STDIN_READ_LIMIT = 256 << 20


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
    if res.failure is not None:
        lines.append(f"failure ({res.failure.kind}, line {res.failure.line}): {res.failure.text}")
    return "\n".join(lines)


def _decode(raw: bytes, name: str) -> str:
    # A log cut short by a node crash can end in NUL padding, and is exactly what needs checking: only NULs
    # before that tail (in the head, as grep looks) mean the wrong file (a checkpoint, a core dump).
    raw = raw.rstrip(b"\x00")
    if b"\x00" in raw[:8192]:
        raise CommandError(f"{name}: binary file (NUL bytes), not a text log", field="LOG")
    # Logs mix encodings (progress bars, locale output): undecodable bytes must not stop the check.
    return raw.decode("utf-8", errors="replace")


def _join(head: bytes, tail: bytes | None, omitted: int, name: str) -> tuple[str, int]:
    """(the text checked, bytes left out between the head and the tail)."""
    if tail is None:
        return _decode(head, name), 0
    print(f"note: {name} is larger than {MAX_LOG_BYTES >> 20} MB: its first {len(head) >> 20} MB and last "
          f"{len(tail) >> 20} MB were checked ({omitted} bytes between them were not)", file=sys.stderr)
    return (_decode(head, name) + f"\n[... {omitted} bytes omitted ...]\n" + tail.decode("utf-8", errors="replace"),
            omitted)


def _read_log(path: Path) -> tuple[str, int]:
    from moe_overlap.skill.files import FileRefused, open_regular, read_head_tail_fd

    try:
        fd = open_regular(path, what="log file")
    except FileRefused as exc:
        raise CommandError(exc.message, field="LOG", fix=exc.fix) from None
    try:
        head, tail, omitted = read_head_tail_fd(fd, MAX_LOG_BYTES)
    except OSError as exc:
        raise CommandError(f"{path}: cannot read ({exc.strerror or exc})", field="LOG") from None
    finally:
        os.close(fd)
    return _join(head, tail, omitted, str(path))


def _read_stdin() -> tuple[str, int]:
    """stdin, bounded like a file: head and tail kept, and reading stops after STDIN_READ_LIMIT bytes (a stream
    that never ends, `yes | moe-overlap check-logs -`, must not hang the check)."""
    stream = sys.stdin.buffer
    head = stream.read(MAX_LOG_BYTES // 8)
    tail, total, stopped = b"", len(head), False
    keep = MAX_LOG_BYTES - len(head)
    while True:
        chunk = stream.read(1 << 20)
        if not chunk:
            break
        total += len(chunk)
        tail = (tail + chunk)[-keep:]
        if total >= STDIN_READ_LIMIT:
            stopped = True
            break
    if stopped:
        print(f"note: stopped reading stdin after {STDIN_READ_LIMIT >> 20} MB", file=sys.stderr)
    if total <= MAX_LOG_BYTES:
        return _decode(head + tail, "stdin"), 0
    return _join(head, tail, total - len(head) - len(tail), "stdin")


def run(args) -> int:
    from moe_overlap.skill.diagnose.log_output import log_output
    from moe_overlap.skill.diagnose.logs import check_training_log

    text, omitted = _read_stdin() if args.log == "-" else _read_log(Path(args.log))
    if not text.strip():
        raise CommandError(f"{args.log}: the log is empty, nothing to check", field="LOG",
                           fix="give the training log (stdout/stderr of rank 0)")
    res = check_training_log(text, expect_overlap=_EXPECT[args.expect_overlap],
                             expect_delay_wgrad=_EXPECT[args.expect_delay_wgrad])
    # The same model check_training_log returns over MCP: where the text came from, what was left unread.
    emit(log_output(res, source="stdin" if args.log == "-" else args.log, omitted=omitted), args.format, _render(res))
    return EXIT_OK if res.ok else EXIT_FAIL
