"""Megatron-LM's own launch scripts and MoE README flag sets (tests/data/megatron_lm/, each with its source file
and commit), as they are and with the README's EP-overlap flags, checked by `validate --argv` against what each
release's own Megatron-LM argument handling says (tests/oracle/mlm_driver.py; 0.16.1's verdicts recorded from its
core_v0.16.1 tag). Then the issue's cases, each asserting the verdict Megatron-LM gives."""

from __future__ import annotations

import pytest

from moe_overlap.skill.rules.validate import validate_config
from tests.oracle import mlm, releases, scripts
from tests.unit.test_oracle_megatron_lm import _need

ENV = dict(torch_version="2.6.0", te_version="2.12.0", gpu="H100", detect=False)


def _ours(argv, env, version):
    return validate_config(argv=argv, megatron_core_version=version, env=env, **ENV)


@pytest.mark.parametrize("version", releases.RELEASES)
def test_scripts_get_megatron_lms_verdict(version):
    _need(version)
    cases = scripts.cases(version)
    theirs = mlm.mlm_verdicts(version)["scripts"]
    known = mlm.messages()
    assert len(cases) >= 10
    for (name, label, argv, env), (ok, _exc, message, _derived) in zip(cases, theirs, strict=True):
        result = _ours(argv, env, version)
        errors = {f.rule for f in result.findings if f.severity == "error"}
        rule = next((r for sub, r in known.items() if sub in message), None)
        assert ok or rule is not None, (name, label, message)  # a rejection for a reason some rule knows
        assert result.valid == ok, (name, label, message, sorted(errors))
        assert ok or rule in errors, (name, label, rule, sorted(errors))
        # Launch scripts carry dozens of flags no rule reads: one line, never one finding each.
        assert sum(f.rule == "config:unknown-key" for f in result.findings) <= 1


def _readme(version="0.19.2"):
    argv, env = scripts.read(scripts.DATA / "moe-readme-mixtral-core_v0.19.0.args")
    return argv, env | {"WORLD_SIZE": "64"}


@pytest.mark.parametrize("version", releases.RELEASES)
def test_vpp_1_from_layers_per_stage_is_none_and_the_overlap_refuses_it(version):
    """32 layers, PP 4, --num-layers-per-virtual-pipeline-stage 8: VPP 1, which Megatron-LM sets to None."""
    argv, env = _readme()
    assert argv[argv.index("--num-layers") + 1] == "32" and argv[argv.index("--pipeline-model-parallel-size") + 1] == "4"
    result = _ours(argv + scripts.OVERLAP, env, version)
    assert not result.valid and "pp-requires-vpp" in {f.rule for f in result.findings if f.severity == "error"}
    (note,) = [f for f in result.findings if f.path == "model.virtual_pipeline_model_parallel_size"
               and f.rule == "config:derived-value"]
    assert "VPP 1" in note.message and "None" in note.message
    assert _ours(argv, env, version).valid  # without the overlap Megatron-LM runs it


@pytest.mark.parametrize("flags", [["--num-virtual-stages-per-pipeline-rank", "2"],
                                   ["--pipeline-model-parallel-layout", "Etttt|(tttt|)*6ttttL"],
                                   ["--num-layers-per-virtual-pipeline-stage", "4"]])
def test_each_vpp_form_is_read(flags):
    argv, env = _readme()
    i = argv.index("--num-layers-per-virtual-pipeline-stage")
    result = _ours(argv[:i] + flags + argv[i + 2:] + scripts.OVERLAP, env, "0.19.2")
    assert result.valid, [f.message for f in result.findings if f.severity == "error"]
    assert not any(flags[0] in f.message for f in result.findings if f.rule == "config:unknown-key")
    assert any("VPP 2" in f.message for f in result.findings if f.rule == "config:derived-value")


def test_fusion_default_gives_no_false_cuda_graph_error():
    """Megatron-LM turns gradient_accumulation_fusion on unless --no-gradient-accumulation-fusion."""
    argv, env = _readme()
    argv = argv + scripts.README_SET + ["--cuda-graph-impl", "transformer_engine", "--cuda-graph-scope", "attn"]
    i = argv.index("--num-layers-per-virtual-pipeline-stage")
    argv[i + 1] = "4"
    assert "--overlap-grad-reduce" in argv  # the README's own: Megatron-LM checks the graph rule with it
    result = _ours(argv, env, "0.19.2")
    assert result.valid and "wgrad-cuda-graph-te-2-12" not in {f.rule for f in result.findings}
    off = _ours(argv + ["--no-gradient-accumulation-fusion"], env, "0.19.2")
    assert "wgrad-cuda-graph-te-2-12" in {f.rule for f in off.findings if f.severity == "error"}


def test_megatron_lm_argv_gets_no_bridge_only_rule_and_each_fact_once():
    argv, env = _readme()
    argv = argv + scripts.README_SET + ["--recompute-granularity", "selective", "--recompute-modules", "moe"]
    argv[argv.index("--num-layers-per-virtual-pipeline-stage") + 1] = "4"
    old = validate_config(argv=argv, megatron_core_version="0.16.1", env=env, **(ENV | {"te_version": "2.7.0"}))
    rules = {f.rule for f in old.findings if f.severity == "error"}
    # Core 0.16 does not check moe recompute (Bridge does); overlap_grad_reduce with delayed wgrad: TE 2.8 (LM's)
    assert "no-moe-recompute-module" not in rules and rules == {"wgrad-overlap-grad-reduce-te-2-8"}
    assert old.rule_set.flavour == "megatron-lm" and "wgrad-overlap-grad-reduce-te-2-7" not in (
        old.rule_set.bridge_rules + old.rule_set.runtime_rules + old.rule_set.core_rules)
    bridge = validate_config({"model": {"expert_model_parallel_size": 8, "num_moe_experts": 8, "bf16": True,
                                        "moe_token_dispatcher_type": "alltoall"},
                              "comm_overlap": {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True},
                              "ddp": {"overlap_grad_reduce": True}}, megatron_core_version="0.16.1", env={},
                             **(ENV | {"te_version": "2.6.0"}))
    hits = {f.rule for f in bridge.findings if f.severity == "error"}
    assert "wgrad-overlap-grad-reduce-te-2-7" in hits and "wgrad-overlap-grad-reduce-te-2-8" not in hits
