"""Issue 34 in the suite: hostile run folders for `verify --judge` and `estimate --from-run` (a sample of
benchmarks/fuzz/fuzz_folders.py's cases, which runs >= 3000 of each: benchmarks/results/fuzz_folders_*.json), and
the issue's cases as fixed examples: no traceback, exit codes 0/1/2, strict JSON, nothing outside the folder
created or changed, nothing over 10 s."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.fuzz import folder_cases as fc
from benchmarks.fuzz.fuzz_exec import LIMIT_S, run_cli, strict_json
from benchmarks.fuzz.fuzz_folders import _quick_plot, snapshot

SAMPLE = 40  # per surface: about 15 s in all on a quiet core


@pytest.fixture(autouse=True)
def _no_drawing(monkeypatch):
    """loss.png through the same writer, without matplotlib's second per plot (fuzz_folders.py does the same)."""
    from moe_overlap.verify.judge import report

    monkeypatch.setattr(report, "plot_losses", _quick_plot)


def _judged(argv: list[str], base: Path, cwd: Path) -> dict:
    before = snapshot(base)
    old = os.getcwd()
    os.chdir(cwd)
    try:
        out = run_cli(argv)
    finally:
        os.chdir(old)
    assert out.crash is None, f"{argv}\n{out.crash}"
    assert "Traceback (most recent call last)" not in out.stderr, out.stderr[-2000:]
    assert out.code in (0, 1, 2), (argv, out.code, out.stderr[-500:])
    assert out.seconds < LIMIT_S, (argv, out.seconds)
    assert strict_json(out.stdout), out.stdout[:500]
    after = snapshot(base)
    assert before == after, f"changed outside the folder: {sorted(set(before) ^ set(after))[:5]}"
    assert not os.listdir(cwd), f"created in the working folder: {os.listdir(cwd)}"
    return {"code": out.code, "data": json.loads(out.stdout)}


@pytest.mark.parametrize("surface", ["judge", "from-run"])
def test_hostile_folder_sample(surface, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    for i in range(SAMPLE):
        base = tmp_path / f"case{i}"
        base.mkdir()
        rng = random.Random(f"suite-{surface}-{i}")
        argv, what = (fc.judge_case if surface == "judge" else fc.from_run_case)(rng, base)
        try:
            _judged(argv, base, cwd)
        except AssertionError as exc:
            raise AssertionError(f"case {i} ({what}): {exc}") from None
        shutil.rmtree(base)


@pytest.fixture
def sandbox(tmp_path):
    run, outside = fc.make_sandbox(tmp_path, random.Random(0))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    return run, outside, cwd, tmp_path


def _judge(sandbox) -> dict:
    run, _, cwd, base = sandbox
    return _judged(["verify", "--judge", str(run), "--format", "json"], base, cwd)


@pytest.mark.parametrize("name", ["report.md", "report.json", "loss.png"])
def test_report_outputs_linked_out_are_replaced_not_followed(sandbox, name):
    run, outside, _, _ = sandbox
    other = run / "report.md" if name != "report.md" else run / "report.json"
    for path, target in ((run / name, outside / "victim-0.json"), (other, outside / "created-here")):
        fc._remove(path)
        path.symlink_to(target)
    got = _judge(sandbox)  # the snapshot check: the victim unchanged, created-here not created
    assert got["code"] in (0, 1) and not (run / name).is_symlink()


@pytest.mark.parametrize("rel,kind,words", [
    ("logs/baseline/rank0.log", "devzero", None),  # was MemoryError at verify/api.py:103
    ("logs/overlap/rank1.log", "fifo", None),  # was a run past 10 s
    ("logs/baseline/rank1.log", "dir", None),  # was IsADirectoryError
    ("logs/overlap/rank0.log", "sparse_big", None),  # 2 GB of NULs: 9.3 s to check at 8 MB, now 1 MB a log
    ("ranks/rank0.jsonl", "loop", "symbolic link"),  # was OSError: Too many levels of symbolic links
    ("ranks/rank1.jsonl", "fifo", "FIFO"),
    ("plan.json", "nonutf8", "UTF-8"),
    ("config.json", "dir", "directory"),
])
def test_fixed_hostile_files(sandbox, rel, kind, words):
    run, outside, _, _ = sandbox
    fc.replace_file(random.Random(1), run / rel, outside, kind)
    got = _judge(sandbox)
    if words:
        assert got["code"] == 2 and words in got["data"]["error"], got
    else:
        assert got["code"] in (0, 1), got
        assert any(rel.split("/")[-1] in p or "regular" in p or "directory" in p
                   for c in got["data"]["summary"]["criteria"] for p in [c["summary"]]) or got["code"] == 1


@pytest.mark.parametrize("field,raw", [("nproc", "9" * 5000), ("specs", "2.5"), ("sm_margin", '"lots"'),
                                       ("nproc", "NaN"), ("nproc", "[" * 5000 + "]" * 5000)])
def test_fixed_hostile_plan_fields(sandbox, field, raw):
    run, _, _, _ = sandbox
    data = json.loads((run / "plan.json").read_text())
    data[field] = "__X__"
    (run / "plan.json").write_text(json.dumps(data).replace('"__X__"', raw))
    got = _judge(sandbox)
    assert got["code"] == 2 and "plan.json" in got["data"]["error"] and got["data"]["field"] == "judge"


def test_records_with_huge_ints_and_non_utf8_lines_are_skipped(sandbox):
    run, _, _, _ = sandbox
    with open(run / "ranks" / "rank0.jsonl", "ab") as f:
        f.write(b'{"kind":"step","t":1,"step":' + b"9" * 5000 + b'}\n\xff\xfe\n{"kind":"init","t":1,"transport":[1]}\n')
    assert _judge(sandbox)["code"] in (0, 1)


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "1e309", "[1.5]", '"x"', "-1"])
def test_from_run_hostile_pieces(sandbox, raw):
    run, _, cwd, base = sandbox
    data = json.loads((run / "report.json").read_text())
    data["analysis"]["pieces"]["a2a_s"] = "__X__"
    (run / "report.json").write_text(json.dumps(data).replace('"__X__"', raw))
    got = _judged(["estimate", "--model", "qwen3-30b-a3b", "--tokens", "4096", "--ep", "8", "--from-run", str(run),
                   "--format", "json"], base, cwd)
    error = got["data"]["error"]
    assert got["code"] == 2 and ("a2a_s" in error or "JSON" in error or "range of a float" in error), got


@pytest.mark.parametrize("argv,field", [
    (["verify", "--judge", "", "--format", "json"], "judge"),
    (["estimate", "--model", "qwen3-30b-a3b", "--tokens", "4096", "--ep", "8", "--from-run", "", "--format", "json"],
     "from_run"),
    (["verify", "--a2a", "nccl", "--format", "json"], "a2a"),
    (["estimate", "--hidden", "2048", "--moe-ffn", "768", "--experts", "64", "--topk", "8", "--tokens", "4096",
      "--ep", "8", "--fabric", "h100-nvlink", "--gpu-preset", "h100", "--a2a-efficiency", "1e-320", "--format",
      "json"], "a2a_efficiency"),
])
def test_refused_options_name_themselves(argv, field, tmp_path):
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        out = run_cli(argv)
    finally:
        os.chdir(old)
    assert out.code == 2 and json.loads(out.stdout)["field"] == field, out.stdout
    assert not os.listdir(tmp_path)  # no ./verify-out


@pytest.mark.parametrize("kind", ["torchrun", "slurm"])
def test_print_launch_json_is_one_document(kind, tmp_path):
    out = run_cli(["verify", "--print-launch", kind, "--out", str(tmp_path / "run"), "--format", "json"])
    data = json.loads(out.stdout)
    assert out.code == 0 and data["launch"] == kind and ("command" in data or "script" in data)


@pytest.mark.parametrize("text,bad", [("model:\n  when: !!timestamp nope\n", "groupdict"),
                                      ("model:\n  expert_model_parallel_size: " + "9" * 5000 + "\n", "sys.set_int")])
def test_validate_speaks_its_own_words(text, bad, tmp_path):
    (tmp_path / "c.yaml").write_text(text)
    out = run_cli(["validate", str(tmp_path / "c.yaml"), "--format", "json"])
    assert out.code == 2 and bad not in out.stdout and "line 2" in json.loads(out.stdout)["error"]


def test_closed_stdout_ends_quietly():
    env = dict(os.environ, PYTHONPATH=str(fc.ROOT))
    proc = subprocess.run(f"{sys.executable} -m moe_overlap.cli card --format json | head -c 0", shell=True,
                          capture_output=True, env=env, cwd=fc.ROOT, executable="/bin/bash")
    assert b"Traceback" not in proc.stderr and b"BrokenPipe" not in proc.stderr, proc.stderr


def test_pieces_record_with_out_of_range_times_is_judged(sandbox):
    """The project's fuzz, case 2181 of seed 0: a pieces record with a 1e-320 s all-to-all gave an infinite rate
    and a ValidationError in the explanation; now the prediction says the pieces give no usable rate."""
    run, _, _, _ = sandbox
    path = run / "ranks" / "rank0.jsonl"
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in recs:
        if rec["kind"] == "pieces":
            rec["a2a_s"] = 1e-320
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert _judge(sandbox)["code"] in (0, 1)
    prediction = json.loads((run / "report.json").read_text())["analysis"]["prediction"]
    assert not prediction["available"] and "out of range" in prediction["reason"], prediction
