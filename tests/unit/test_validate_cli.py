"""`moe-overlap validate`: exit codes 0/1/2, JSON output, readable errors, and no torch import."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moe_overlap.cli import main

ROOT = Path(__file__).resolve().parents[2]
ALLTOALL = str(ROOT / "examples" / "ep-overlap-alltoall.yaml")
ENV = ["--torch-version", "2.6.0", "--te-version", "2.7.0", "--gpu", "H100"]


def test_valid_config_exits_0_text(capsys):
    assert main(["validate", ALLTOALL, *ENV]) == 0
    out = capsys.readouterr().out
    assert "VALID" in out and "wgrad-not-in-first-rollout" in out and "fix:" in out


def test_invalid_config_exits_1_json(capsys):
    assert main(["validate", ALLTOALL, "--torch-version", "2.5.1", "--format", "json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert [f["rule"] for f in errors] == ["torch-min-2-6"]
    assert set(errors[0]) == {"rule", "severity", "path", "message", "fix", "source"}
    assert doc["environment"]["torch_version"] == "2.5.1"
    assert doc["rule_set"]["name"].startswith("megatron-core")


def test_set_and_argv(capsys):
    assert main(["validate", ALLTOALL, *ENV, "--set", "model.expert_model_parallel_size=1", "--format", "json"]) == 1
    assert "ep-size-gt-1" in capsys.readouterr().out
    argv = "--overlap-moe-expert-parallel-comm --expert-model-parallel-size 8 --num-experts 64 " \
           "--moe-token-dispatcher-type alltoall --bf16"
    assert main(["validate", "--argv", argv, *ENV]) == 0
    assert main(["validate", "--argv", argv.replace("--bf16", ""), *ENV]) == 1


@pytest.mark.parametrize("content,needle", [
    ("model:\n  expert_model_parallel_size: eight\n", "model.expert_model_parallel_size"),
    ("model: [1,\n", "line 2"),
    ("", "empty config"),
    ("model:\n  moe_token_dispatcher_type: nccl\n", "model.moe_token_dispatcher_type"),
])
def test_bad_input_exits_2_with_one_message(tmp_path, capsys, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    assert main(["validate", str(path), *ENV]) == 2
    captured = capsys.readouterr()
    assert needle in captured.err and "Traceback" not in captured.err
    assert captured.err.startswith("error: ")


def test_bad_input_json_error_document(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("model:\n  bf16: 1.5e\n  bf16: true\n")
    assert main(["validate", str(path), "--format", "json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert "duplicate key 'bf16'" in doc["error"]


def test_bad_environment_values_exit_2(capsys):
    assert main(["validate", ALLTOALL, "--gpu", "Voodoo5"]) == 2
    assert "unknown GPU name" in capsys.readouterr().err
    assert main(["validate", ALLTOALL, "--torch-version", "latest"]) == 2
    assert main(["validate", ALLTOALL, "--megatron-core-version", "x"]) == 2
    assert main(["validate"]) == 2


def test_validate_never_imports_torch():
    code = (f"import sys; from moe_overlap.cli import main; rc = main(['validate', {ALLTOALL!r}, '--format', 'json']); "
            "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH', 'TE' if 'transformer_engine' in sys.modules "
            "else 'NO-TE', rc, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert "NO-TORCH NO-TE" in proc.stderr, proc.stderr
    json.loads(proc.stdout)  # one JSON document on stdout
