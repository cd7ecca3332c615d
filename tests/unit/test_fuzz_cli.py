"""Fuzz every CLI command in process (issue 15): no traceback, exit codes 0/1/2 only, strict JSON, no input over
10 s; the issue's cases are fixed examples. The generators are benchmarks/fuzz/fuzz_inputs.py; benchmarks/fuzz/fuzz.py runs
them with >= 3000 inputs per parser (results committed in benchmarks/results/fuzz.json). Here a fixed, modest
budget keeps CI fast."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from benchmarks.fuzz import fuzz

BUDGET = {"validate": 200, "estimate": 200, "check-logs": 200, "generate": 60, "diagnose": 60, "card": 30,
          "verify": 100}


def _check(argv: list[str], out, json_expected: bool) -> None:
    assert out.crash is None, f"{argv[:6]}\n{out.crash}"
    assert "Traceback (most recent call last)" not in out.stderr, out.stderr[-2000:]
    assert out.code in (0, 1, 2), (argv[:6], out.code, out.stderr[-500:])
    assert out.seconds < fuzz.LIMIT_S, (argv[:6], out.seconds)
    if json_expected:
        assert fuzz.strict_json(out.stdout), (argv[:6], out.stdout[:500])


@pytest.mark.parametrize("parser", sorted(BUDGET))
def test_fuzz_cli_command(parser):
    @settings(max_examples=BUDGET[parser], deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(fuzz.STRATEGIES[parser])
    def one(case):
        folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
        try:
            argv, stdin, json_expected = fuzz.cli_argv(parser, case, folder)
            _check(argv, fuzz.run_cli(argv, stdin), json_expected)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    one()


def _file(tmp_path: Path, name: str, text: str | bytes) -> str:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return str(path)


ISSUE_YAML = {  # issue 15's tracebacks, hangs and wrong results of `validate`, as files
    "int-0x": "model: !!int 0x\n", "bool-maybe": "model:\n  bf16: !!bool maybe\n",
    "timestamp": "model: !!timestamp nope\n", "feb-31": "model:\n  num_moe_experts: 2024-02-31\n",
    "5000-digits": "model:\n  num_moe_experts: " + "9" * 5000 + "\n",
    "alias-bomb": fuzz.fi.ALIAS_BOMB, "flow-list": "model: [" + ",".join(["1"] * 400_000) + "]\n",
    "modle": "modle:\n  expert_model_parallel_size: 8\n",
    "paralel": "model:\n  expert_model_parallel_size: 8\n  num_moe_experts: 64\n"
               "comm_overlap:\n  overlap_moe_expert_paralel_comm: true\n",
}


@pytest.mark.parametrize("case", sorted(ISSUE_YAML))
def test_issue_cases_validate(tmp_path, case):
    argv = ["validate", _file(tmp_path, "c.yaml", ISSUE_YAML[case]), "--format", "json"]
    out = fuzz.run_cli(argv)
    _check(argv, out, True)
    assert out.code == 2, out.stdout[:500]
    if case in ("modle", "paralel"):
        near = {"modle": "'model'", "paralel": "'overlap_moe_expert_parallel_comm'"}[case]
        assert near in json.loads(out.stdout)["error"]


@pytest.mark.parametrize("argv", [
    ["--set", "model.num_moe_experts=" + "9" * 5000], ["--torch-version", "9" * 5000],
    ["--set", "model.x=[&a [1,2], *a]"], ["--megatron-core-version", "1." * 3000],
])
def test_issue_cases_validate_options(tmp_path, argv):
    argv = ["validate", _file(tmp_path, "c.yaml", "model: {}\n"), *argv, "--format", "json"]
    out = fuzz.run_cli(argv)
    _check(argv, out, True)
    assert out.code == 2


def test_issue_cases_special_files(tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    for cmd, path in (("validate", str(fifo)), ("validate", "/dev/zero"), ("check-logs", str(fifo)),
                      ("check-logs", "/dev/zero"), ("validate", str(tmp_path))):
        argv = [cmd, path, "--format", "json"]
        out = fuzz.run_cli(argv)
        _check(argv, out, True)
        assert out.code == 2 and out.seconds < 2
    secret = _file(tmp_path, "shadow", "root:$6$salt$hash:19000:0:99999:7:::\n")
    out = fuzz.run_cli(["validate", secret])
    assert out.code == 2 and "$6$" not in out.stderr and "not read as a training config" in out.stderr


@pytest.mark.parametrize("flags,code", [
    (["--chunks", "1e8"], 2), (["--layers", "100000", "--micro-batches", "100000"], 2),
    (["--tflops", "1e400"], 2), (["--intra-gbps", "1e-300"], 2), (["--hidden", "9" * 5000], 2),
    (["--layers", "1024", "--micro-batches", "65536"], 0),
])
def test_issue_cases_estimate(flags, code):
    argv = ["estimate", *[x for k, v in fuzz.fi.GOOD_ESTIMATE.items() for x in (k, v)], *flags, "--format", "json"]
    t0 = time.monotonic()
    out = fuzz.run_cli(argv)
    _check(argv, out, True)
    assert out.code == code and time.monotonic() - t0 < 5, out.stdout[-300:]


@pytest.mark.parametrize("line", [" " * 60_000 + "x", "overlap_moe_expert_parallel_comm ..." + " " * 60_000 + "x",
                                  "overlap_moe_expert_parallel_comm ........ " + "9" * 5000])
def test_issue_cases_check_logs(tmp_path, line):
    argv = ["check-logs", _file(tmp_path, "t.log", line + "\n"), "--format", "json"]
    out = fuzz.run_cli(argv)
    _check(argv, out, True)
    assert out.seconds < 2


@pytest.mark.parametrize("value", ["abc", "[1, 2]"])
def test_issue_cases_verify_config(tmp_path, value):
    cfg = _file(tmp_path, "c.yaml", f"model:\n  num_moe_experts: 4\n  moe_router_topk: {value}\n")
    argv = ["verify", cfg, "--print-launch", "torchrun", "--out", str(tmp_path / "o")]
    out = fuzz.run_cli(argv)
    _check(argv, out, False)
    assert out.code == 2 and "moe_router_topk" in out.stderr


@pytest.mark.parametrize("plan", ["{}", '{"nproc": 1e9}'])
def test_issue_cases_verify_judge(tmp_path, plan):
    from moe_overlap.verify.plan.outdir import MARKER

    (tmp_path / MARKER).write_text("{}")
    (tmp_path / "plan.json").write_text(plan)
    (tmp_path / "config.json").write_text('{"format": "moe-overlap"}')
    argv = ["verify", "--judge", str(tmp_path), "--format", "json"]
    out = fuzz.run_cli(argv)
    _check(argv, out, True)
    assert out.code == 2 and out.seconds < 2 and "plan" in json.loads(out.stdout)["error"].lower()
