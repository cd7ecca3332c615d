"""Key names a user may have misspelt: did-you-mean hints, and the near misses that must stop a config.

Why a near miss is an error, not a note: an unknown key is kept and not read, so ``overlap_moe_expert_paralel_comm:
true`` would leave the overlap off and the config would validate VALID while the right spelling gives errors.
A key one edit away (one letter added, dropped, changed, or two neighbours swapped: ``modle``) from a known name is
almost always that name; a key further away may be a field of a newer release and stays a note.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence


def one_edit_away(a: str, b: str) -> bool:
    """True when `a` becomes `b` by one insertion, deletion, substitution or swap of adjacent characters."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        diff = [i for i in range(len(a)) if a[i] != b[i]]
        if len(diff) == 1:
            return True
        i, j = diff[0], diff[-1]
        return len(diff) == 2 and j == i + 1 and a[i] == b[j] and a[j] == b[i]
    short, long_ = (a, b) if len(a) < len(b) else (b, a)
    i = 0
    while i < len(short) and short[i] == long_[i]:
        i += 1
    return short[i:] == long_[i + 1:]


def near_miss(key: str, known: Iterable[str]) -> str | None:
    """The known name `key` is one edit away from (case and '-' vs '_' ignored too), or None."""
    folded = key.lower().replace("-", "_")
    for name in sorted(known):
        if name == key:
            return None
    for name in sorted(known):
        if folded == name.lower().replace("-", "_") or one_edit_away(folded, name.lower().replace("-", "_")):
            return name
    return None


def did_you_mean(key: str, choices: Sequence[str]) -> str:
    if len(key) > 100:  # no config key is this long; difflib's cost grows with it
        return ""
    close = difflib.get_close_matches(key, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""
