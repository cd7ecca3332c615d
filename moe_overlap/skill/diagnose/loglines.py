"""The lines of a training log as the checks read them: launcher and logging prefixes taken off, work linear in
the input (torch-free).

Why: the same log reaches us as rank 0 printed it, or through srun (``0: ``, `` 0: ``), torchrun (``[rank0]: ``,
``[default0]:``), both (``0: [rank0]: ``), or a logging handler (``2026-11-29 10:00:00,123 - INFO - ``,
``[2026-11-29T10:00:00.123Z] [INFO] [megatron.bridge.training] ``, ``INFO:megatron.core:``), with the ranks' lines
interleaved. A check that anchors its pattern at the start of a line must see the same text in every case.

Linear: every prefix pattern is anchored at the line start and its repeats are bounded (at most a few hundred
characters), at most MAX_PREFIXES are taken off a line, and the config-key patterns look at no more than
KEY_LINE_CHARS characters of a line. No pattern has nested or overlapping unbounded repeats.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

MAX_PREFIXES = 8
KEY_LINE_CHARS = 4096  # an effective-config line is short; a 60k-character line is a progress bar or data
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
_STAMP = (r"\[?\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?(?:Z|[ ]?[+-]\d{2}:?\d{2}|[ ]?UTC)?\]?"
          r"|\[?\d{2}:\d{2}:\d{2}(?:[.,]\d{1,9})?\]?")
_PREFIX = re.compile(
    r"\A(?:"
    r"[ \t]{0,16}\d{1,6}:(?:[ \t]|$)"  # srun --label: "0: ", " 12: "
    r"|[ \t]{0,16}\[(?:rank|default)\d{1,6}\]:?[ \t]?"  # torchrun: "[rank0]: ", "[default0]:"
    rf"|[ \t]{{0,16}}(?:{_STAMP})(?:[ \t]{{1,4}}[-|][ \t]{{1,4}}[\w.\-]{{1,200}}(?=[ \t]{{1,4}}[-|][ \t]{{1,4}}{_LEVEL}\b))?"
    r"(?:[ \t]{0,4}[-|](?=[ \t]))?[ \t]{0,4}"  # timestamps, with "- logger.name" before a level
    r"|[ \t]{0,16}\[NeMo [DIWEC] [^\]\n]{1,200}\][ \t]{0,4}"  # NeMo: "[NeMo I 2026-11-29 10:00:00 file:12] "
    rf"|[ \t]{{0,16}}\[?{_LEVEL}\]?(?:[ \t]{{0,4}}[-|][ \t]{{1,4}}|:(?:[\w.\-]{{1,200}}:)?[ \t]{{0,4}}|[ \t]{{1,4}})"
    r"|[ \t]{0,16}\[[\w.\-/<>]{1,200}(?::\d{1,7})?(?::[\w.<>\-]{1,200})?\][ \t]{0,4}(?:[-|:][ \t]{1,4})?"  # [logger]
    r")")


def strip_prefixes(line: str) -> str:
    """`line` without the launcher / logging prefixes it starts with (at most MAX_PREFIXES of them)."""
    for _ in range(MAX_PREFIXES):
        m = _PREFIX.match(line)
        if m is None or not m.end():
            break
        line = line[m.end():]
    return line


def line_count(text: str) -> int:
    """Lines as an editor numbers them ('\n' ends a line; a last line without one still counts)."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def lines_matching(pattern: re.Pattern[str], text: str) -> Iterator[tuple[int, int, str]]:
    """(1-based number, offset of its start, the line as logged) of each line holding a match of `pattern`.

    The search runs in C over the whole text and resumes after the line of each hit, so the Python work is per
    matching line, never per line or per hit; `pattern` must not match across a newline.
    """
    number, counted, pos = 1, 0, 0
    while pos <= len(text):
        m = pattern.search(text, pos)
        if m is None:
            return
        start = text.rfind("\n", 0, m.start()) + 1
        end = text.find("\n", m.start())
        end = len(text) if end < 0 else end
        number += text.count("\n", counted, start)
        counted = start
        yield number, start, text[start:end].rstrip("\r")
        pos = end + 1


def lines_before(text: str, start: int, count: int) -> list[str]:
    """Up to `count` lines before the line that starts at offset `start`, nearest last (walked back with rfind)."""
    out: list[str] = []
    end = start - 1
    while end >= 0 and len(out) < count:
        begin = text.rfind("\n", 0, end) + 1
        out.append(text[begin:end].rstrip("\r"))
        end = begin - 1
    return out[::-1]


def log_value(text: str):
    """A logged value as Python data: booleans and None in any spelling Python, YAML or argparse prints, small
    integers as int (at most 18 digits: no int() of a 5000-digit run), anything else as the string."""
    t = text.strip().strip("'\"")
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null", "~", ""):
        return None
    digits = t[1:] if t.startswith("-") else t
    if 0 < len(digits) <= 18 and digits.isascii() and digits.isdigit():
        return int(t)
    return t
