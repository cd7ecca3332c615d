"""Megatron-Bridge 0.6.2 as an oracle for Bridge-style configs, on the megatron-core release it pins (0.19.2).

500 generated configs (model / comm_overlap / ddp sections, mixed-precision recipes, a recipe's
apply_flex_dispatcher_backend call, real GPU names) go through Bridge's own CommOverlapConfig checks,
apply_flex_dispatcher_backend and validate_flex_dispatcher_backend, then Core's TransformerConfig, in a child
process (tests/oracle/bridge_driver.py). Our validator, on the Core + Bridge rules of 0.19, must agree on every
config, and our apply_flex_dispatcher_backend must set the same dispatcher fields as Bridge's. The differences
allowed are listed with their reason in tests/oracle/run.py (INTENTIONAL, BRIDGE_ONLY_VIA_COMM).
"""

from __future__ import annotations

import os

import pytest

from moe_overlap.skill.rules.validate import validate_config
from tests.oracle import bridge_cases, releases
from tests.oracle.fetch import BRIDGE, bridge_dir, missing
from tests.oracle.run import BRIDGE_N, BRIDGE_ONLY_VIA_COMM, INTENTIONAL, run_bridge_oracle

BRIDGE_RULES = {"num-experts-gt-1", "wgrad-cuda-graph-te-2-12", "wgrad-grad-accum-fusion-te-2-7",
                "wgrad-overlap-grad-reduce-te-2-7", "flex-backend-gpu-support"}


@pytest.fixture(scope="module")
def report():
    gone = [m for m in missing() if m in (BRIDGE, bridge_cases.CORE_RELEASE)]
    if gone:
        if os.environ.get(releases.REQUIRED_ENV):
            pytest.fail(f"{', '.join(gone)} not unpacked in {releases.cache_dir()}: run `make oracle-releases`")
        pytest.skip(f"{', '.join(gone)} not unpacked (`make oracle-releases`)")
    return run_bridge_oracle()


def test_bridge_and_the_validator_agree_on_every_config(report):
    assert report.cases == BRIDGE_N >= 400
    core_file, bridge_file = report.files
    assert core_file.startswith(str(releases.release_dir(bridge_cases.CORE_RELEASE))), core_file
    assert bridge_file.startswith(str(bridge_dir())), bridge_file
    assert not report.unrelated, f"{len(report.unrelated)} rejections no known check makes: {report.unrelated[0]}"
    assert not report.disagreements, f"{len(report.disagreements)} disagreements, first: {report.disagreements[0]}"
    assert report.accepted >= 100 and report.rejected >= 100, (report.accepted, report.rejected)
    # Bridge's own checks and Core's both reject configs: the comparison is not Core's alone.
    assert report.by_stage.get("comm", 0) >= 50 and report.by_stage.get("flex", 0) >= 5, report.by_stage
    assert report.by_stage.get("core", 0) >= 50, report.by_stage
    # Each Bridge-only rule was, at least once, the only reason for a rejection.
    assert BRIDGE_RULES <= report.sole_reason, sorted(BRIDGE_RULES - report.sole_reason)


def test_apply_flex_dispatcher_backend_matches_bridge(report):
    assert report.applied >= 100
    assert not report.apply_disagreements, report.apply_disagreements[0]


def test_differences_are_listed_with_a_reason(report):
    assert set(report.intentional) <= set(INTENTIONAL) | set(BRIDGE_ONLY_VIA_COMM), sorted(report.intentional)


def test_a_comm_overlap_section_turns_a_model_flag_off():
    """Bridge writes comm_overlap's value (False when unset) onto the model: the model's flag is not the one read."""
    config = {"model": {"overlap_moe_expert_parallel_comm": True, "expert_model_parallel_size": 1,
                        "num_moe_experts": 8, "moe_token_dispatcher_type": "alltoall", "bf16": True},
              "comm_overlap": {"tp_comm_overlap": False}}
    result = validate_config(config, megatron_core_version="0.19.2", detect=False, env={}, torch_version="2.6.0")
    assert result.valid  # EP 1 would fail the overlap's checks, but the overlap is off
    note = next(f for f in result.findings if f.path == "model.overlap_moe_expert_parallel_comm")
    assert note.severity == "warning" and "turned off" in note.message
    del config["comm_overlap"]
    assert not validate_config(config, megatron_core_version="0.19.2", detect=False, env={},
                               torch_version="2.6.0").valid


def test_overlap_grad_reduce_on_in_either_section_counts():
    config = {"model": {"expert_model_parallel_size": 8, "num_moe_experts": 8, "moe_token_dispatcher_type": "alltoall",
                        "bf16": True, "gradient_accumulation_fusion": False},
              "comm_overlap": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True,
                               "overlap_grad_reduce": False},
              "ddp": {"overlap_grad_reduce": True}}
    result = validate_config(config, megatron_core_version="0.19.2", detect=False, env={}, torch_version="2.6.0",
                             te_version="2.6.0")
    assert "wgrad-overlap-grad-reduce-te-2-7" in {f.rule for f in result.findings if f.severity == "error"}


def test_the_deprecated_deepep_switch_overrides_any_backend_but_hybridep():
    """Core sets the backend to deepep whatever it was (ncclep too), so Bridge's GPU check sees deepep: GB200 fails
    (found by the oracle on seed 2, 4000 configs)."""
    config = {"model": {"expert_model_parallel_size": 8, "num_moe_experts": 8, "moe_token_dispatcher_type": "flex",
                        "moe_flex_dispatcher_backend": "ncclep", "moe_enable_deepep": True, "bf16": True}}
    result = validate_config(config, megatron_core_version="0.19.2", detect=False, env={}, gpu="NVIDIA GB200")
    assert "flex-backend-gpu-support" in {f.rule for f in result.findings if f.severity == "error"}
    assert validate_config(config, megatron_core_version="0.19.2", detect=False, env={}, gpu="H100").valid
