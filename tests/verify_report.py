"""A finished verification run's report.json with round pieces, for the tests that feed it to the estimator
(`moe-overlap estimate --from-run DIR`)."""

from __future__ import annotations

import json
from pathlib import Path

PIECES = {"comm_s": 0.01, "a2a_s": 0.009, "count_exchange_s": 0.001, "experts_s": 0.03, "experts_fwd_s": 0.01,
          "experts_dgrad_s": 0.01, "experts_wgrad_s": 0.01,
          "probe": {"a2a_s": 0.004, "experts_s": 0.006, "both_s": 0.008, "overlap_efficiency": 0.5},
          "a2a_bytes_off_rank": 2**25, "rows_received": 4096, "expert_flops": int(2e12), "a2a_calls": 32,
          "count_exchanges": 8, "rounds": 3, "layers": 2, "micro_batches": 4}


def write_run(folder: Path) -> Path:
    """report.json of an NCCL run on 2 ranks in ``folder`` (its probe's overlap efficiency: 0.5); returns folder."""
    (folder / "report.json").write_text(json.dumps({
        "format": "moe-overlap-verification-report", "out_dir": str(folder), "config": {"precision": "bf16"},
        "environment": {"backend": "nccl", "nproc": 2}, "analysis": {"pieces": PIECES}}))
    return folder
