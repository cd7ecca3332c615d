"""Strict JSON for files nobody here wrote: RFC 8259 only, with bounds (torch-free).

Python's json module accepts NaN / Infinity / -Infinity, turns 1e309 into inf, raises RecursionError on deep
nesting and a message about sys.set_int_max_str_digits on a 5000-digit integer. Here each of those is a
StrictJSONError saying what was wrong; the caller adds the file's name.
"""

from __future__ import annotations

import json
import math
from typing import Any

MAX_DEPTH = 64
MAX_INT_DIGITS = 40  # far above any count or byte size a run writes (2**64 has 20 digits)


class StrictJSONError(ValueError):
    """Not strict JSON: `message` says what and where."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _no_constant(name: str) -> Any:
    raise StrictJSONError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise StrictJSONError(f"an integer of {len(text.lstrip('-'))} digits (more than {MAX_INT_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > 400:
        raise StrictJSONError(f"a number of {len(text)} characters")
    value = float(text)
    if not math.isfinite(value):
        raise StrictJSONError(f"{text[:40]} is out of the range of a float")
    return value


def _nan_ok(name: str) -> float:
    return float(name)


def _depth(value: Any, limit: int) -> int:
    """Nesting depth, without recursion (json's scanner already stopped a pathological one)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def loads(data: bytes | str, *, allow_nan: bool = False, max_depth: int = MAX_DEPTH) -> Any:
    """Parse `data` (UTF-8 bytes or text) as strict JSON, or raise StrictJSONError.

    `allow_nan`: NaN / Infinity constants are accepted (the ranks' own records: json.dumps writes a diverged
    loss as NaN); numbers out of float range and huge integers are still refused.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise StrictJSONError(f"not UTF-8 (byte {exc.start}: {data[exc.start:exc.start + 1]!r})") from None
    else:
        text = data
    try:
        value = json.loads(text, parse_int=_int, parse_float=_float,
                           parse_constant=_nan_ok if allow_nan else _no_constant)
    except StrictJSONError:
        raise
    except RecursionError:
        raise StrictJSONError(f"nested deeper than {max_depth} levels") from None
    except ValueError as exc:  # JSONDecodeError: position and what was expected, in json's own words
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise StrictJSONError(f"not valid JSON: {msg}{where}") from None
    if _depth(value, max_depth) > max_depth:
        raise StrictJSONError(f"nested deeper than {max_depth} levels")
    return value
