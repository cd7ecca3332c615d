"""check_training_log on our verify logs, Megatron-LM argument dumps and Megatron-Bridge YAML dumps."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from moe_overlap.skill.diagnose.logs import check_training_log


def _status(res, cid):
    return next(c.status for c in res.checks if c.id == cid)


MEGATRON_LM = """\
using world size: 16, data-parallel size: 16, context-parallel size: 1
------------------------ arguments ------------------------
  delay_wgrad_compute ............................. {wgrad}
  expert_model_parallel_size ...................... 16
  moe_flex_dispatcher_backend ..................... {backend}
  moe_token_dispatcher_type ....................... {dispatcher}
  overlap_moe_expert_parallel_comm ................ {overlap}
-------------------- end of arguments ---------------------
 [2026-11-29 10:00:00] iteration        1/      20 | consumed samples: 1024 | lm loss: 1.2E+01 |
 [2026-11-29 10:00:30] iteration        2/      20 | consumed samples: 2048 | lm loss: 1.1E+01 |
"""

BRIDGE_YAML = """\
------- Task Configuration -------
comm_overlap:
  overlap_moe_expert_parallel_comm: true
  delay_wgrad_compute: false
model:
  _target_: megatron.bridge.models.qwen.Qwen3MoEModelProvider
  expert_model_parallel_size: 8
  moe_token_dispatcher_type: flex
  moe_flex_dispatcher_backend: hybridep
"""


def test_megatron_lm_dump_confirms_overlap():
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="alltoall", overlap=True))
    assert res.ok, res.checks
    assert res.format == "megatron-lm"
    assert res.effective_config["overlap_moe_expert_parallel_comm"] is True
    assert res.effective_config["moe_token_dispatcher_type"] == "alltoall"
    assert _status(res, "overlap-flag-logged") == "pass"


def test_overlap_false_fails_when_expected():
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="alltoall", overlap=False))
    assert not res.ok
    assert _status(res, "overlap-flag-logged") == "fail"
    # and passes when the caller expects the baseline
    assert check_training_log(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="alltoall", overlap=False),
                              expect_overlap=False).ok


def test_flex_backend_is_judged_only_with_the_flex_dispatcher():
    # Megatron-LM prints its default backend (deepep) whatever the dispatcher: an alltoall run is clean.
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend="deepep", dispatcher="alltoall", overlap=True))
    assert res.ok, res.checks
    assert _status(res, "flex-backend-active") == "info"
    assert "not used" in next(c.message for c in res.checks if c.id == "flex-backend-active")
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend="hybridep", dispatcher="flex", overlap=True))
    assert res.ok and _status(res, "flex-backend-active") == "pass"


def test_overlap_with_allgather_dispatcher_fails():
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="allgather", overlap=True))
    assert _status(res, "dispatcher-logged") == "fail"


def test_bridge_yaml_flex_hybridep():
    res = check_training_log(BRIDGE_YAML, expect_delay_wgrad=False)
    assert res.ok, res.checks
    assert res.format == "megatron-bridge"
    assert res.effective_config["moe_flex_dispatcher_backend"] == "hybridep"
    assert _status(res, "flex-backend-active") == "pass"
    assert _status(res, "delay-wgrad-logged") == "pass"


def test_missing_config_cannot_be_confirmed():
    res = check_training_log("step 1 loss 3.2\nstep 2 loss 3.1\n")
    assert not res.ok
    assert _status(res, "overlap-flag-logged") == "fail"


def test_commoverlap_assertion_is_found():
    text = BRIDGE_YAML + (
        "Traceback (most recent call last):\n"
        '  File "comm_overlap.py", line 420, in _get_model_comm_overlap_cfgs\n'
        "    assert model_cfg.expert_model_parallel_size > 1\n"
        "AssertionError: expert_model_parallel_size must be > 1 for EP overlap\n")
    res = check_training_log(text)
    assert not res.ok
    for cid in ("no-overlap-config-assertion", "no-assertion-errors", "no-tracebacks"):
        assert _status(res, cid) == "fail", cid
    assert any(e.kind == "assertion" for e in res.errors)


@pytest.mark.parametrize("line,kind", [
    ("[rank3]:[E ProcessGroupNCCL.cpp:616] Watchdog caught collective operation timeout: WorkNCCL(...)", "hang"),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error", "nccl"),
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", "gloo"),
])
def test_distributed_errors(line, kind):
    res = check_training_log(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="alltoall", overlap=True)
                             + line + "\n")
    assert not res.ok
    assert res.errors and res.errors[0].kind == kind


def test_last_value_wins_and_key_value_form():
    text = "Namespace(overlap_moe_expert_parallel_comm=False, delay_wgrad_compute=False)\n" \
           "Namespace(overlap_moe_expert_parallel_comm=True, moe_token_dispatcher_type='alltoall')\n"
    res = check_training_log(text)
    assert res.effective_config["overlap_moe_expert_parallel_comm"] is True
    assert res.effective_config["moe_token_dispatcher_type"] == "alltoall"
    assert res.ok


def test_module_is_torch_free():
    code = "import sys, moe_overlap.skill.diagnose.logs; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_check_logs(tmp_path):
    good = tmp_path / "good.log"
    good.write_text(MEGATRON_LM.format(wgrad=True, backend=None, dispatcher="alltoall", overlap=True))
    bad = tmp_path / "bad.log"
    bad.write_text(MEGATRON_LM.format(wgrad=False, backend=None, dispatcher="alltoall", overlap=False))
    run = [sys.executable, "-m", "moe_overlap.cli", "check-logs"]
    assert subprocess.run(run + [str(good)], capture_output=True).returncode == 0
    out = subprocess.run(run + [str(bad), "--format", "json"], capture_output=True, text=True)
    assert out.returncode == 1 and '"ok":false' in out.stdout  # compact, as check_training_log returns it
    assert json.loads(out.stdout)["source"] == str(bad) and "truncated" not in json.loads(out.stdout)
    assert subprocess.run(run + [str(tmp_path / "missing.log")], capture_output=True).returncode == 2


@pytest.mark.parametrize("content, expected", [
    (None, "is a directory"),
    (b"\x7fELF\x02\x01\x00\x00 binary", "binary file"),
    (b"", "empty"),
    (b"  \n\n", "empty"),
])
def test_cli_check_logs_bad_input_exit_2(tmp_path, capsys, content, expected):
    from moe_overlap.cli import main

    path = tmp_path / "x.log"
    if content is None:
        path.mkdir()
    else:
        path.write_bytes(content)
    assert main(["check-logs", str(path)]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_cli_check_logs_nul_padding_after_a_crash_is_still_read(tmp_path, capsys):
    from moe_overlap.cli import main

    path = tmp_path / "crashed.log"
    text = MEGATRON_LM.format(wgrad=True, backend=None, dispatcher="alltoall", overlap=True)
    path.write_bytes(text.encode() + b"\x00" * 4096)
    assert main(["check-logs", str(path)]) == 0


# megatron-bridge 0.6.2 src/megatron/bridge/training/flex_dispatcher_backend.py:64-67 (and :73-76, :82-85)
FALLBACK = ("[WARNING | megatron.bridge.training.flex_dispatcher_backend]: DeepEP is only applicable to Ampere, "
            "Hopper, and Blackwell (B200/B300) GPUs. Current GPU: Tesla T4. Falling back to alltoall.")


def test_flex_fallback_warning_fails_the_flex_check():
    log = BRIDGE_YAML.replace("moe_token_dispatcher_type: flex", "moe_token_dispatcher_type: alltoall")
    log = log.replace("moe_flex_dispatcher_backend: hybridep", "moe_flex_dispatcher_backend: null")
    res = check_training_log(FALLBACK + "\n" + log)
    check = next(c for c in res.checks if c.id == "no-flex-fallback")
    assert check.status == "fail" and check.line == 1 and "Falling back to alltoall" in check.evidence
    assert "alltoall" in check.message and not res.ok


@pytest.mark.parametrize("line", [
    "NCCL EP is only applicable to Hopper and Blackwell GPUs. Current GPU: NVIDIA A100. Falling back to alltoall.",
    "Not a valid flex dispatcher backend. Expected one of deepep, hybridep, or ncclep. Skipping flex dispatcher "
    "backend configuration.",
    "Flex dispatcher backends are only applicable to MoE models. Model config does not use MoE (num_moe_experts is "
    "not set or is 0). Skipping flex dispatcher configuration.",
])
def test_every_bridge_flex_skip_is_reported(line):
    res = check_training_log(BRIDGE_YAML + line + "\n")
    assert next(c for c in res.checks if c.id == "no-flex-fallback").status == "fail"


def test_no_fallback_passes():
    res = check_training_log(BRIDGE_YAML)
    assert next(c for c in res.checks if c.id == "no-flex-fallback").status == "pass" and res.ok
