#!/usr/bin/env python3
"""Fuzz every CLI command and every MCP tool's arguments with hostile input; count what issue 15 forbids.

    python benchmarks/fuzz/fuzz.py [--examples 3000] [--seed 0] [--only validate,estimate,check-logs,mcp]
                              [--out benchmarks/results/fuzz.json]

Per parser: inputs run, tracebacks (an exception no command or tool turned into a clear error; over MCP: an internal
error or an exception text in a result), inputs over 10 s, the slowest input, the peak resident memory of the
process that handled the inputs, exit codes seen (only 0/1/2 allowed), and `--format json` outputs that are not
strict JSON (NaN / Infinity). Inputs come from benchmarks/fuzz/fuzz_inputs.py (hypothesis strategies); `--seed` picks
the draw, so another seed is a held-out run of the same kind. CLI inputs run in a spawned worker process
(`cli.main`, stdout/stderr captured; killed and replaced if an input hangs), and a sample also through a real
`python -m moe_overlap.cli` process; MCP calls go to a `moe-overlap-mcp` stdio server process (`--max-jobs 0`:
run_verification checks its input, launches nothing), whose peak RSS is read from /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # benchmarks.* and moe_overlap from this checkout, however started

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from benchmarks.fuzz import fuzz_inputs as fi  # noqa: E402
from benchmarks.fuzz.fuzz_exec import LIMIT_S, Handler, Outcome, run_cli, run_cli_process, strict_json  # noqa: E402, F401
from benchmarks.fuzz.tally import Tally, write_results  # noqa: E402

CLI_PARSERS = ("validate", "estimate", "check-logs", "generate", "diagnose", "card", "verify")
PARSERS = (*CLI_PARSERS, "mcp")
MINOR = ("generate", "diagnose", "card", "verify")  # not among the issue's >= 3000-input parsers


def write_input(folder: Path, name: str, content: bytes, kind: str) -> str:
    """A path of the asked kind in `folder`: a regular file holding `content`, a FIFO, a folder, a missing
    file, a symlink to the file, /dev/zero or /dev/null."""
    path = folder / name
    if kind in ("regular", "symlink", "stdin"):
        target = folder / ("target-" + name) if kind == "symlink" else path
        target.write_bytes(content)
        if kind == "symlink":
            path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dir":
        path.mkdir()
    elif kind == "devzero":
        return "/dev/zero"
    elif kind == "devnull":
        return "/dev/null"
    return str(path)


def _opt(argv: list[str], flag: str, value) -> None:
    if value is not None:
        argv += [flag, str(value)]


MAX_ARG_BYTES = 131_071  # Linux MAX_ARG_STRLEN, the terminating NUL left out


def _argv_safe(argv: list[str]) -> list[str]:
    """What a shell can pass: no NUL, only encodable text, each argument within the kernel's length limit."""
    out = []
    for a in argv:
        raw = a.replace("\x00", "").encode("utf-8", "replace")[:MAX_ARG_BYTES]
        out.append(raw.decode("utf-8", "ignore"))
    return out


def cli_argv(parser: str, case: dict, folder: Path) -> tuple[list[str], bytes, bool]:
    """(argv, stdin, whether stdout must be JSON) for one drawn case."""
    argv, stdin, json_expected = _cli_argv(parser, case, folder)
    return _argv_safe(argv), stdin, json_expected


def _cli_argv(parser: str, case: dict, folder: Path) -> tuple[list[str], bytes, bool]:
    fmt = case.get("format", "text")
    if parser == "validate":
        argv = ["validate", write_input(folder, "config" + case["suffix"], case["content"], case["kind"])]
        for item in case["overrides"]:
            argv += ["--set", item]
        for flag, key in (("--argv", "argv"), ("--torch-version", "torch"), ("--te-version", "te"),
                          ("--gpu", "gpu"), ("--megatron-core-version", "core")):
            _opt(argv, flag, case[key])
    elif parser == "estimate":
        argv = ["estimate"]
        for flag, value in case["flags"].items():
            argv += [flag, value] if not value.startswith("-") else [f"{flag}={value}"]
    elif parser == "check-logs":
        path = "-" if case["kind"] == "stdin" else write_input(folder, "train" + case["suffix"], case["content"],
                                                               case["kind"])
        argv = ["check-logs", path]
        _opt(argv, "--expect-overlap", case["expect_overlap"])
        _opt(argv, "--expect-delay-wgrad", case["expect_wgrad"])
        stdin = case["content"] if case["kind"] == "stdin" else b""
        return argv + ["--format", fmt], stdin, fmt == "json"
    elif parser == "generate":
        argv = ["generate"]
        for flag, value in case["flags"].items():
            argv += [f"{flag}={value}"] if flag != "--plan" else [flag]
    elif parser == "diagnose":
        argv = ["diagnose", case["text"].replace("\x00", "")]
        _opt(argv, "--limit", case["limit"])
    elif parser == "card":
        argv = ["card"] + ([case["name"]] if case["name"] is not None else [])
        _opt(argv, "--field", case["field"])
        return argv, b"", False
    elif parser == "verify":
        return fi.verify_argv(case, folder), b"", case["mode"] == "judge"
    else:
        raise ValueError(parser)
    return argv + ["--format", fmt], b"", fmt == "json"


STRATEGIES = {"validate": fi.validate_cases(), "estimate": fi.estimate_cases(), "check-logs": fi.check_logs_cases(),
              "generate": fi.generate_cases(), "diagnose": fi.diagnose_cases, "card": fi.card_cases,
              "verify": fi.verify_cases()}


def fuzz_cli(parser: str, examples: int, seed_value: int, subprocess_sample: int) -> Tally:
    tally = Tally(parser)
    sample_every = max(1, examples // subprocess_sample) if subprocess_sample else 0
    handler = Handler()

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(fi.st.data())
    def body(data):
        case = data.draw(STRATEGIES[parser])
        folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
        try:
            argv, stdin, json_expected = cli_argv(parser, case, folder)
            out = handler.run(argv, stdin)
            tally.add(repr(argv)[:400], out, json_expected=json_expected)
            if sample_every and tally.inputs % sample_every == 0 and "fifo" not in repr(case.get("kind")):
                # the same case again in a fresh folder (the first run may have written there: --out)
                fresh = Path(tempfile.mkdtemp(prefix="fuzz-"))
                try:
                    argv2, stdin2, _ = cli_argv(parser, case, fresh)
                    proc = run_cli_process(argv2, stdin2)
                finally:
                    shutil.rmtree(fresh, ignore_errors=True)
                tally.subprocess_checked += 1
                if proc.code not in (0, 1, 2) or "Traceback" in proc.stderr or proc.code != out.code:
                    tally.tracebacks += 1
                    tally._example(f"subprocess {argv[:3]}: exit {proc.code} (in process {out.code})\n"
                                   f"{proc.stderr[-800:]}")
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    body()
    handler.close()
    tally.handler_peak_rss_mb = round(handler.peak_rss_mb, 1)  # type: ignore[attr-defined]
    return tally


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_one(parser: str, examples: int, seed_value: int, subprocess_sample: int) -> dict:
    t0 = time.perf_counter()
    if parser == "mcp":
        from benchmarks.fuzz import fuzz_mcp

        tally = fuzz_mcp.fuzz(examples, seed_value)
    else:
        tally = fuzz_cli(parser, examples, seed_value, subprocess_sample)
    row = dict(tally.__dict__)
    # The process that handled the inputs: the CLI worker, or the MCP server (its VmHWM); the fuzzer apart.
    row.update(wall_s=round(time.perf_counter() - t0, 1), peak_rss_mb=row.pop("handler_peak_rss_mb"),
               fuzzer_peak_rss_mb=round(peak_rss_mb(), 1))
    return row


def _table(rows: list[dict]) -> str:
    head = (f"{'parser':<11} {'inputs':>7} {'tracebacks':>10} {'>10 s':>6} {'slowest s':>9} {'peak RSS MB':>11} "
            f"{'bad JSON':>8}  exit codes")
    lines = [head, "-" * len(head)]
    for r in rows:
        codes = ", ".join(f"{k}:{v}" for k, v in sorted(r["exit_codes"].items()))
        lines.append(f"{r['parser']:<11} {r['inputs']:>7} {r['tracebacks']:>10} {r['over_limit']:>6} "
                     f"{r['slowest_s']:>9.2f} {r['peak_rss_mb']:>11.0f} {r['bad_json']:>8}  {codes}")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--examples", type=int, default=3000, help="inputs per parser (default 3000)")
    ap.add_argument("--minor-examples", type=int, help="inputs for generate, diagnose, card and verify "
                    "(default: --examples)")
    ap.add_argument("--seed", type=int, default=0, help="hypothesis seed (another seed: a held-out run)")
    ap.add_argument("--only", help="comma list of " + ", ".join(PARSERS))
    ap.add_argument("--subprocess-sample", type=int, default=40, help="inputs per CLI parser also run as a real "
                    "process (default 40)")
    ap.add_argument("--out", type=Path, help="write the results as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one parser, in its own process (its own peak RSS)
        print(json.dumps(run_one(args.child, args.examples, args.seed, args.subprocess_sample)))
        return 0
    parsers = args.only.split(",") if args.only else list(PARSERS)
    rows = []
    for parser in parsers:
        count = args.minor_examples if args.minor_examples and parser in MINOR else args.examples
        cmd = [sys.executable, __file__, "--child", parser, "--examples", str(count), "--seed",
               str(args.seed), "--subprocess-sample", str(args.subprocess_sample)]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return 1
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        print(f"{parser}: {rows[-1]['inputs']} inputs, {rows[-1]['tracebacks']} tracebacks, "
              f"{rows[-1]['wall_s']} s", file=sys.stderr, flush=True)
    print(_table(rows))
    for r in rows:
        if r.get("per_tool"):
            print(f"\n{r['parser']} answers per tool: " + "; ".join(
                f"{tool} {', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}"
                for tool, kinds in sorted(r["per_tool"].items())))
    for r in rows:
        for ex in r["examples"]:
            print(f"\n[{r['parser']}] {ex}")
    if args.out:
        write_results(args.out, "benchmarks/fuzz/fuzz.py", sys.argv[1:], args.seed, rows)
    bad = sum(r["tracebacks"] + r["over_limit"] + r["bad_json"] for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
