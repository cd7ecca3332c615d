"""check-logs reads a log the same with and without launcher / logging prefixes (issue 15), in linear time."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from moe_overlap.skill.diagnose.loglines import strip_prefixes
from moe_overlap.skill.diagnose.logs import check_training_log

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"
CLEAN = sorted(LOGS.glob("*_clean.log"))

PREFIXES = {
    "srun": lambda r, i: f"{r}: ",
    "srun-padded": lambda r, i: f" {r}: ",
    "torchrun-rank": lambda r, i: f"[rank{r}]: ",
    "torchrun-tee": lambda r, i: f"[default{r}]:",
    "srun+torchrun": lambda r, i: f"{r}: [rank{r}]: ",
    "logging-dashes": lambda r, i: f"2026-11-29 10:00:{i % 60:02d},{i % 1000:03d} - INFO - ",
    "logging-named": lambda r, i: f"2026-11-29 10:00:{i % 60:02d},123 - megatron.training - INFO - ",
    "logging-brackets": lambda r, i: f"[2026-11-29 10:00:{i % 60:02d},123] [INFO] [megatron.training.utils:42] ",
    "logging-default": lambda r, i: "INFO:megatron.training:",
    "iso": lambda r, i: f"2026-11-29T10:00:{i % 60:02d}.{i:06d}Z ",
    "iso-offset": lambda r, i: f"[2026-11-29T10:00:{i % 60:02d}+01:00] ",
    "srun+iso": lambda r, i: f"{r}: 2026-11-29T10:00:{i % 60:02d}Z ",
    "nemo": lambda r, i: f"[NeMo I 2026-11-29 10:00:{i % 60:02d} train:{i}] ",
}


def _summary(res):
    return res.ok, res.format, res.effective_config, [(c.id, c.status) for c in res.checks]


def _prefixed(text: str, prefix, rank: int = 0) -> str:
    return "".join(prefix(rank, i) + line + "\n" for i, line in enumerate(text.splitlines()))


@pytest.mark.parametrize("log", CLEAN, ids=[p.stem for p in CLEAN])
@pytest.mark.parametrize("style", sorted(PREFIXES))
def test_same_verdict_with_and_without_prefixes(log, style):
    text = log.read_text()
    plain = check_training_log(text)
    assert plain.ok, plain.checks
    assert _summary(check_training_log(_prefixed(text, PREFIXES[style]))) == _summary(plain)


@pytest.mark.parametrize("log", CLEAN, ids=[p.stem for p in CLEAN])
def test_same_verdict_with_srun_ranks_interleaved(log):
    text = log.read_text()
    lines = text.splitlines()
    ranks = 4
    mixed = [f"{r}: {line}" for i in range(len(lines)) for r in range(ranks) for line in [lines[i]]]
    # srun delivers each rank's lines in order, the ranks' lines in any order: rotate the ranks per line
    mixed = [mixed[i * ranks + (i + j) % ranks] for i in range(len(lines)) for j in range(ranks)]
    assert _summary(check_training_log("\n".join(mixed) + "\n")) == _summary(check_training_log(text))


def test_a_failure_behind_prefixes_is_still_found():
    text = (LOGS / "megatron_lm_clean.log").read_text() + (
        "Traceback (most recent call last):\n"
        "AssertionError: overlap_moe_expert_parallel_comm requires expert_model_parallel_size > 1\n")
    for style in ("srun+torchrun", "logging-brackets", "iso"):
        res = check_training_log(_prefixed(text, PREFIXES[style]))
        failed = {c.id for c in res.checks if c.status == "fail"}
        assert {"no-tracebacks", "no-assertion-errors", "no-overlap-config-assertion"} <= failed, style


@pytest.mark.parametrize("line,expected", [
    ("0: [rank0]:   overlap_moe_expert_parallel_comm: true", "  overlap_moe_expert_parallel_comm: true"),
    ("12:34:56 iteration 1/ 2", "iteration 1/ 2"),
    ("[moe-overlap] mode overlap | step 1/16", "mode overlap | step 1/16"),
    ("model:", "model:"),
    ("  expert_model_parallel_size: 8", "  expert_model_parallel_size: 8"),
    ("WARNING:root:x", "x"),
])
def test_strip_prefixes(line, expected):
    assert strip_prefixes(line) == expected


@pytest.mark.parametrize("line", [
    " " * 60_000 + "x",
    "overlap_moe_expert_parallel_comm ..." + " " * 60_000 + "x",
    "overlap_moe_expert_parallel_comm: " + " " * 60_000 + "x",
    "overlap_moe_expert_parallel_comm='" * 3000,
    "a." * 30_000 + "overlap_moe_expert_parallel_comm .. x",
    "[" * 60_000,
    "0: " * 20_000,
    "ProcessGroupNCCL" * 4000,
    "\n" * 200_000 + "comm_overlap:",
    "\t \n" * 100_000,
])
def test_pathological_lines_are_linear(line):
    t0 = time.perf_counter()
    check_training_log(line)
    assert time.perf_counter() - t0 < 3.0
