"""Ctrl-C during a verification: the first one stops the ranks, any later one waits for the report (torch-free).

Why: the launcher turns the first Ctrl-C (KeyboardInterrupt) into a cancelled run and still writes its report;
a second Ctrl-C, pressed while the ranks are being killed or the report written (the loss plot can take a
second), used to abort that and leave no report at all. SIGQUIT (Ctrl-\\) still ends the process at once.
Only the main thread can handle signals: elsewhere (an MCP job thread) this does nothing.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


class _Guard:
    def __init__(self) -> None:
        self.interrupted = False
        self.holding = False

    def handler(self, signum, frame) -> None:
        if self.interrupted or self.holding:
            print("moe-overlap: still stopping the ranks and writing the report; Ctrl-\\ ends it at once "
                  "(no report)", file=sys.stderr, flush=True)
            return
        self.interrupted = True
        raise KeyboardInterrupt

    def hold(self) -> None:
        """From now on every Ctrl-C only prints a note (the report is being written)."""
        self.holding = True


@contextmanager
def interrupts_once() -> Iterator[_Guard]:
    guard = _Guard()
    if threading.current_thread() is not threading.main_thread():
        yield guard
        return
    try:
        previous = signal.signal(signal.SIGINT, guard.handler)
    except ValueError:  # not the main interpreter
        yield guard
        return
    try:
        yield guard
    finally:
        signal.signal(signal.SIGINT, previous)
