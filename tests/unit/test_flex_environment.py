"""Flex activation with Bridge semantics, environment detection/overrides, version parsing."""

import subprocess

import pytest

from moe_overlap.skill.config.load import ConfigError
from moe_overlap.skill.rules import environment
from moe_overlap.skill.rules.environment import detect_environment, parse_gpu
from moe_overlap.skill.rules.flex_backend import apply_flex_dispatcher_backend, backend_supported
from moe_overlap.skill.rules.validate import validate_config
from moe_overlap.skill.rules.versions import at_least, parse_version, select_core

BASE = {"comm_overlap": {"overlap_moe_expert_parallel_comm": True},
        "model": {"expert_model_parallel_size": 8, "num_moe_experts": 64, "moe_token_dispatcher_type": "alltoall",
                  "moe_shared_expert_overlap": True, "bf16": True}}


def test_flex_activation_sets_type_backend_and_shared_overlap_off():
    new, notes = apply_flex_dispatcher_backend(BASE, "deepep", gpu="H100")
    assert new["model"]["moe_token_dispatcher_type"] == "flex"
    assert new["model"]["moe_flex_dispatcher_backend"] == "deepep"
    assert new["model"]["moe_shared_expert_overlap"] is False
    assert notes == []
    assert BASE["model"]["moe_token_dispatcher_type"] == "alltoall"  # input untouched
    result = validate_config(new, torch_version="2.6.0", gpu="H100", detect=False, env={})
    assert result.valid and not result.findings


def test_flex_falls_back_to_alltoall_on_unsupported_gpu():
    new, notes = apply_flex_dispatcher_backend(BASE, "deepep", gpu="GB200")
    assert new["model"]["moe_token_dispatcher_type"] == "alltoall"
    assert new["model"]["moe_flex_dispatcher_backend"] is None
    assert notes and "fell back to moe_token_dispatcher_type=alltoall" in notes[0]
    hybrid, notes = apply_flex_dispatcher_backend(BASE, "hybridep", gpu="GB200")
    assert hybrid["model"]["moe_token_dispatcher_type"] == "flex" and notes == []


def test_flex_without_gpu_or_experts_or_with_a_bad_backend():
    new, notes = apply_flex_dispatcher_backend(BASE, "hybridep")
    assert new["model"]["moe_token_dispatcher_type"] == "flex" and "not checked" in notes[0]
    dense = {"model": {"num_moe_experts": None}}
    same, notes = apply_flex_dispatcher_backend(dense, "deepep", gpu="H100")
    assert same == dense and "not an MoE model" in notes[0]
    same, notes = apply_flex_dispatcher_backend(BASE, "nccl", gpu="H100")
    assert same == BASE and "not a flex dispatcher backend" in notes[0]


@pytest.mark.parametrize("backend,name,cc,expected", [
    ("deepep", None, "8.0", True), ("deepep", None, "9.0", True), ("deepep", "NVIDIA B200", "10.0", True),
    ("deepep", "NVIDIA GB200", "10.0", False), ("deepep", None, "10.0", None), ("deepep", None, "7.5", False),
    ("hybridep", None, "10.3", True), ("hybridep", None, "12.0", False), ("hybridep", None, None, None),
])
def test_backend_gpu_gate(backend, name, cc, expected):
    assert backend_supported(backend, name, cc) is expected


@pytest.mark.parametrize("text,name,cc", [
    ("H100", "H100", "9.0"), ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", "9.0"), ("9.0", None, "9.0"),
    ("sm_90", None, "9.0"), ("sm100", None, "10.0"), ("gb200", "gb200", "10.0"), ("A10", "A10", "8.6"),
    ("H20", "H20", "9.0"), ("L40S", "L40S", "8.9"),
])
def test_parse_gpu(text, name, cc):
    assert parse_gpu(text) == (name, cc)


def test_unknown_gpu_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown GPU name"):
        parse_gpu("Voodoo5")


def test_given_values_win_and_nothing_detected_when_told(monkeypatch):
    env = detect_environment(torch_version="2.6.0", te_version="2.7.0", gpu="H100",
                             env={"CUDA_DEVICE_MAX_CONNECTIONS": "32"})
    assert (env.torch_version, env.torch_version_source) == ("2.6.0", "given")
    assert (env.te_version, env.gpu_name, env.compute_capability) == ("2.7.0", "H100", "9.0")
    assert env.cuda_device_max_connections == "32"
    bare = detect_environment(detect=False, env={})
    assert bare.torch_version is None and bare.torch_version_source == "unknown" and bare.gpu_source == "unknown"


def test_detection_reads_metadata_and_nvidia_smi(monkeypatch):
    calls = []

    def fake_run(cmd, **kwargs):
        calls.append((cmd, kwargs.get("timeout")))
        return subprocess.CompletedProcess(cmd, 0, stdout="NVIDIA H200, 9.0\n", stderr="")

    environment._nvidia_smi.cache_clear()
    monkeypatch.setattr(environment.subprocess, "run", fake_run)
    env = detect_environment(env={})
    environment._nvidia_smi.cache_clear()
    assert (env.gpu_name, env.compute_capability, env.gpu_source) == ("NVIDIA H200", "9.0", "detected")
    assert calls[0][0][0] == "nvidia-smi" and calls[0][1] <= 5
    assert env.torch_version_source == "detected"  # torch is installed in this venv (metadata, not import)


def test_nvidia_smi_hang_or_absence_is_unknown(monkeypatch):
    def hang(cmd, **kwargs):
        raise subprocess.TimeoutExpired(cmd, kwargs.get("timeout"))

    environment._nvidia_smi.cache_clear()
    monkeypatch.setattr(environment.subprocess, "run", hang)
    env = detect_environment(env={})
    environment._nvidia_smi.cache_clear()
    assert env.gpu_source == "unknown" and env.compute_capability is None


def test_versions():
    assert parse_version("2.6.0") == (2, 6, 0, 0)
    assert parse_version("2.13.0+cpu") == (2, 13, 0, 0)
    assert at_least("2.6.0a0", "2.6.0") is False  # a pre-release is below its release, as Core sees it
    assert at_least("2.10.0", "2.9.0") is True and at_least(None, "2.6.0") is None
    assert at_least("garbage", "2.6.0") is None
    assert select_core("0.16.1").line == (0, 16) and select_core("0.18.2").line == (0, 18)
    assert "older than" in select_core("0.12.0").note
    with pytest.raises(ConfigError, match="not a version number"):
        select_core("latest")


@pytest.mark.parametrize("given", [{"te_version": "2.x"}, {"torch_version": "2.6-ish"},
                                   {"megatron_core_version": "0.x"}])
def test_typed_version_must_be_a_whole_version_number(given):
    # parse_version alone would read '2.x' as 2.0 and judge the TE rules against a version nobody has.
    with pytest.raises(ConfigError, match="not a version number"):
        validate_config({"model": {"expert_model_parallel_size": 2}}, env={}, detect=False, **given)


@pytest.mark.parametrize("text", ["2.6.0", "2.7.0rc1", "2.6.0+cu124", "2.7.0.dev0", "2.6.0.post1", "v2.6"])
def test_typed_version_forms_that_are_accepted(text):
    assert validate_config({"model": {"expert_model_parallel_size": 2}}, env={}, detect=False,
                           te_version=text).environment.te_version == text
