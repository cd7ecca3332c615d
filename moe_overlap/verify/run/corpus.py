"""The small deterministic training corpus shipped in the package, as byte-level tokens (torch-free).

``data/corpus.txt`` is a few KB of self-written English prose with repeated patterns, so a small LM's
loss visibly falls within a few dozen steps. Tokens are raw bytes (vocabulary 256): no tokenizer to
install, nothing to download, identical on every machine.

Batches depend only on (seed, step, micro-batch, rank): every mode of a verification sees exactly the
same data, which is what makes the loss trajectories comparable bit for bit.
"""

from __future__ import annotations

import random
from functools import lru_cache
from pathlib import Path

CORPUS_PATH = Path(__file__).resolve().parent / "data" / "corpus.txt"
VOCAB_SIZE = 256


@lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    return CORPUS_PATH.read_bytes()


def sample_windows(*, seed: int, step: int, micro: int, rank: int, batch: int, seq: int) -> list[bytes]:
    """`batch` windows of `seq + 1` bytes (inputs are [:-1], labels [1:]) at deterministic offsets."""
    data = corpus_bytes()
    if seq + 1 > len(data):
        raise ValueError(f"seq_length={seq} is longer than the corpus ({len(data)} bytes)")
    # String seeding hashes with SHA-512: stable across processes and Python versions (unlike hash()).
    rng = random.Random(f"moe-overlap:{seed}:{step}:{micro}:{rank}")
    starts = [rng.randrange(0, len(data) - seq) for _ in range(batch)]
    return [data[s:s + seq + 1] for s in starts]
