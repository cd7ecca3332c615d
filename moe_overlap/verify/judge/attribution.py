"""Which rank failed first (torch-free): the one the report names.

Why not the earliest error record: a rank killed by a signal writes none, and its peers then fail in their next
collective ("Connection closed by peer") and do write one, so `kill -9` of rank 1 was reported as "rank 0
exited with status 1"; a stopped rank (SIGSTOP) stops sending heartbeats like the peers waiting for it, so the
hang was pinned on whichever rank happened to log last.

So each rank's end is classified by cause. Primary: killed by a signal the launcher did not send, stopped
(``/proc/PID/stat`` state T), an exception that is not a peer's failure seen through a collective, or a non-zero
exit without any record. Secondary: an error that only reports a peer gone (PEER_ERROR). The first rank is the
earliest primary (by the time its end was seen or recorded); only when every failure is secondary the earliest
of those. Every rank's exit status, signal and state go into the report, so the attribution can be checked.
"""

from __future__ import annotations

import re
import signal
from dataclasses import asdict, dataclass
from typing import Any

# What a rank says when a *peer* died or stopped (gloo, NCCL, the c10d store): a consequence, not a cause.
PEER_ERROR = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|Connection refused|"
    r"NCCL communicator was aborted|remote process exited|DistNetworkError|DistBackendError|"
    r"[Tt]imed out|[Tt]imeout|Socket Timeout|recvValue|unexpected end of file|Read error|"
    r"ProcessGroupGloo|gloo/transport")


@dataclass
class RankEnd:
    """How one rank ended (or stood) when the launcher stopped the run."""

    rank: int
    pid: int | None
    state: str  # running | stopped | exited | killed (by a signal not ours) | unfinished (judged offline)
    exit_code: int | None = None  # as the rank ended on its own (None: it was still running, or stopped)
    signal: str | None = None  # the signal that ended it, when one did (not ours)
    seen_at: float | None = None  # time.time() when the launcher saw it end
    error_at: float | None = None  # time of its first `error` record
    peer_error: bool = False  # its error only reports a peer gone
    last_record: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def signal_name(code: int | None) -> str | None:
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


def proc_state(pid: int | None) -> str | None:
    """The one-letter state of a live process (R, S, D, T, t, Z ...), None when it is gone or unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
            stat = f.read()
    except OSError:
        return None
    rest = stat[stat.rfind(")") + 2:].split()
    return rest[0] if rest else None


def describe(end: RankEnd) -> str:
    if end.state == "killed":
        return f"rank {end.rank} was killed by {end.signal} (exit status {end.exit_code})"
    if end.state == "stopped":
        return f"rank {end.rank} is stopped (SIGSTOP or SIGTSTP: process state T) and sends no heartbeat"
    if end.state == "unfinished" and end.error_at is None:
        return (f"rank {end.rank} stopped without finishing (last record: {end.last_record or 'none'}); "
                "killed or still running?")
    if end.error_at is not None and end.exit_code is None:
        return f"rank {end.rank} raised an exception"
    if end.exit_code is not None:
        why = " after a peer failed" if end.peer_error else ""
        return f"rank {end.rank} exited with status {end.exit_code}{why}"
    return f"rank {end.rank} stopped without finishing"


def first_failure(ends: list[RankEnd]) -> RankEnd | None:
    """The rank to name: the earliest primary failure, else the earliest secondary one (module docstring)."""
    hard = ("killed", "stopped", "unfinished")
    failed = [e for e in ends if e.state in hard or e.error_at is not None or (e.exit_code not in (None, 0))]
    if not failed:
        return None
    primary = [e for e in failed if e.state in hard or not e.peer_error]
    pool = primary or failed

    def when(e: RankEnd) -> float:
        times = [t for t in (e.seen_at, e.error_at) if t is not None]
        return min(times) if times else float("inf")

    return min(pool, key=lambda e: (when(e), e.rank))


def error_of(records: list[dict[str, Any]]) -> tuple[float | None, str | None]:
    """(time, traceback) of a rank's first `error` record."""
    for rec in records:
        if rec.get("kind") == "error":
            tb = rec.get("traceback")
            return rec.get("t"), tb if isinstance(tb, str) else None
    return None, None


def is_peer_error(traceback: str | None) -> bool:
    """The traceback's last lines report a peer's failure (the exception, not the frames above it)."""
    if not traceback:
        return False
    tail = "\n".join(traceback.strip().splitlines()[-4:])[-2000:]
    return PEER_ERROR.search(tail) is not None
