"""What a fuzz run counts per parser (inputs, tracebacks, inputs over the limit, exit codes, bad JSON),
shared by benchmarks/fuzz/fuzz.py (the CLI parsers) and benchmarks/fuzz/fuzz_mcp.py (the MCP tools), so
neither imports the other."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.fuzz.fuzz_exec import LIMIT_S, Outcome, strict_json


@dataclass
class Tally:
    parser: str
    inputs: int = 0
    tracebacks: int = 0
    over_limit: int = 0
    slowest_s: float = 0.0
    slowest_input: str = ""
    exit_codes: dict[str, int] = field(default_factory=dict)
    bad_json: int = 0
    examples: list[str] = field(default_factory=list)  # the first few problems, for the report
    subprocess_checked: int = 0

    def add(self, case_text: str, out: Outcome, *, json_expected: bool, problem: str | None = None) -> None:
        self.inputs += 1
        if out.seconds > self.slowest_s:
            self.slowest_s, self.slowest_input = out.seconds, case_text[:200]
        if out.seconds > LIMIT_S:
            self.over_limit += 1
            self._example(f"over {LIMIT_S:g} s ({out.seconds:.1f} s): {case_text[:300]}")
        code = "timeout" if out.code is None else str(out.code)
        self.exit_codes[code] = self.exit_codes.get(code, 0) + 1
        crash = out.crash or problem
        if crash is None and "Traceback (most recent call last)" in out.stderr:
            crash = out.stderr[-1500:]
        if crash is None and out.code not in (0, 1, 2, None):
            crash = f"exit code {out.code}"
        if crash is not None:
            self.tracebacks += 1
            self._example(f"{case_text[:300]}\n{crash[-1500:]}")
        if json_expected and out.code in (0, 1, 2) and not strict_json(out.stdout):
            self.bad_json += 1
            self._example(f"not strict JSON: {case_text[:300]}\n{out.stdout[:300]}")

    def _example(self, text: str) -> None:
        if len(self.examples) < 10:
            self.examples.append(text)


def write_results(out: Path, script: str, argv: list[str], seed: int, rows: list[dict]) -> None:
    """A fuzz run's results JSON: the command, date, machine (with its load: these runs time themselves) and the
    rows, as every committed fuzz result holds them."""
    record = {"command": f"python {script} " + " ".join(argv),
              "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                          "load_average": list(os.getloadavg())},
              "python": platform.python_version(), "limit_s": LIMIT_S, "seed": seed, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
