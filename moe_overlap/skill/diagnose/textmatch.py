"""Word-pattern matching for `diagnose`, in time linear in the text.

The text is tokenised once: lower case, runs of `[a-z0-9_]` are words, runs of `<>=!%` are operator tokens
(so `torch version < 2.6.0` reads `torch version < 2 6 0`), everything else separates. Lines of a Megatron
argument dump (`name ........ value`) are dropped: they list every flag whatever the failure, so they are noise.

A pattern is a string of slots separated by spaces:
  - `word`             the token `word`;
  - `a|b|c`            any of these tokens;
  - `pre*`             any token that starts with `pre` (`regress*` matches `regression`, `regressed`);
  - `...`              a gap: the next part starts within `GAP` tokens after the previous part ends.
Each alternative must be one token as the tokeniser cuts it (`speed-up` is two: write `speed up`).

Cost: every phrase (a gap-free part) of every pattern goes into one trie of tokens; the text is walked once,
from each token at most as deep as the longest phrase, so the walk is O(tokens x longest phrase). Gapped
patterns then combine the phrases' sorted start positions with bisection. No regular expression of the
patterns is ever run, so nothing backtracks, and no pattern rescans the text.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import product

GAP = 12  # tokens between two parts of a gapped pattern: about one sentence of an error message
MAX_EXPANSION = 512  # alternatives multiplied out per phrase; a pattern over it is rejected when loaded
_TOKEN = re.compile(r"[a-z0-9_]+|[<>=!%]+")
_KEBAB = re.compile(r"[a-z0-9-]+")
_DUMP_LEADER = "...."  # Megatron-LM prints its arguments as `name ........ value`


class PatternError(ValueError):
    """A pattern that is not in the syntax above; the message names the pattern and what is wrong."""


def tokens(text: str) -> list[str]:
    """The text's tokens, argument-dump lines left out. One pass of a non-backtracking scan per line."""
    out: list[str] = []
    for line in text.lower().splitlines():
        if _DUMP_LEADER not in line:
            out.extend(_TOKEN.findall(line))
    return out


def kebab_words(text: str) -> set[str]:
    """Hyphenated identifiers in the text (rule ids, failure-mode names), for exact set lookups."""
    return {w.strip("-") for w in _KEBAB.findall(text.lower())}


@dataclass(frozen=True)
class _Slot:
    words: tuple[str, ...]
    prefixes: tuple[str, ...]


@dataclass(frozen=True)
class Pattern:
    source: str
    parts: tuple[tuple[_Slot, ...], ...]  # phrases, separated by gaps


def parse(pattern: str) -> Pattern:
    parts: list[list[_Slot]] = [[]]
    for chunk in pattern.lower().split():
        if chunk == "...":
            if not parts[-1]:
                raise PatternError(f"pattern {pattern!r}: '...' must sit between two words")
            parts.append([])
            continue
        words, prefixes = [], []
        for alt in chunk.split("|"):
            stem = alt[:-1] if alt.endswith("*") else alt
            if not stem or not _TOKEN.fullmatch(stem):
                raise PatternError(f"pattern {pattern!r}: {alt!r} is not one token (letters, digits, _ or one of "
                                   "<>=!%); split it into words")
            (prefixes if alt.endswith("*") else words).append(stem)
        parts[-1].append(_Slot(tuple(words), tuple(prefixes)))
    if not parts[-1]:
        raise PatternError(f"pattern {pattern!r}: empty, or ends with '...'")
    for phrase in parts:
        size = 1
        for slot in phrase:
            size *= len(slot.words) + len(slot.prefixes)
        if size > MAX_EXPANSION:
            raise PatternError(f"pattern {pattern!r}: {size} alternatives multiplied out (at most {MAX_EXPANSION})")
    return Pattern(pattern, tuple(tuple(p) for p in parts))


@dataclass
class _Node:
    children: dict[str, _Node] = field(default_factory=dict)
    ends: list[int] = field(default_factory=list)  # phrase ids that end here


class Matcher:
    """All patterns of a set compiled once; `find(tokens)` says which patterns occur."""

    def __init__(self, patterns: list[Pattern]):
        self.patterns = patterns
        self._root = _Node()
        self._phrase_len: list[int] = []
        self._pattern_phrases: list[tuple[int, ...]] = []
        self._prefix_lengths: set[int] = set()
        self._prefixes: set[str] = set()
        index: dict[tuple[_Slot, ...], int] = {}
        for pattern in patterns:
            ids = []
            for phrase in pattern.parts:
                if phrase not in index:
                    index[phrase] = len(self._phrase_len)
                    self._phrase_len.append(len(phrase))
                    self._insert(phrase, index[phrase])
                ids.append(index[phrase])
            self._pattern_phrases.append(tuple(ids))

    def _insert(self, phrase: tuple[_Slot, ...], pid: int) -> None:
        keys_per_slot = []
        for slot in phrase:
            keys = list(slot.words) + [p + "*" for p in slot.prefixes]
            for p in slot.prefixes:
                self._prefix_lengths.add(len(p))
                self._prefixes.add(p)
            keys_per_slot.append(keys)
        for path in product(*keys_per_slot):
            node = self._root
            for key in path:
                node = node.children.setdefault(key, _Node())
            node.ends.append(pid)

    def _keys(self, token: str, memo: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
        keys = memo.get(token)
        if keys is None:
            keys = (token, *(token[:n] + "*" for n in sorted(self._prefix_lengths)
                             if len(token) >= n and token[:n] in self._prefixes))
            memo[token] = keys
        return keys

    def find(self, toks: list[str]) -> list[bool]:
        """For each pattern, whether it occurs in `toks`."""
        starts: list[list[int]] = [[] for _ in self._phrase_len]
        memo: dict[str, tuple[str, ...]] = {}
        n = len(toks)
        for i in range(n):
            frontier = [self._root]
            j = i
            while frontier and j < n:
                keys = self._keys(toks[j], memo)
                nxt = []
                for node in frontier:
                    for key in keys:
                        child = node.children.get(key)
                        if child is not None:
                            nxt.append(child)
                            for pid in child.ends:
                                if not starts[pid] or starts[pid][-1] != i:
                                    starts[pid].append(i)
                frontier = nxt
                j += 1
        return [self._occurs(ids, starts) for ids in self._pattern_phrases]

    def _occurs(self, ids: tuple[int, ...], starts: list[list[int]]) -> bool:
        if any(not starts[pid] for pid in ids):
            return False
        if len(ids) == 1:
            return True
        # Each start of the first part that can be continued part by part within the gap; starts are sorted,
        # so the earliest continuation is the best one (a later one only leaves less room for what follows).
        for first in starts[ids[0]]:
            end = first + self._phrase_len[ids[0]] - 1
            for pid in ids[1:]:
                candidates = starts[pid]
                k = bisect_right(candidates, end)
                if k == len(candidates) or candidates[k] > end + 1 + GAP:
                    break
                end = candidates[k] + self._phrase_len[pid] - 1
            else:
                return True
        return False
