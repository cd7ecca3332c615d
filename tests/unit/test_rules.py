"""One violating and one passing config per rule, parametrized from the rule table; unknown versions warn."""

import re
from pathlib import Path

import pytest
import yaml

from moe_overlap.skill.card.cards import load_card
from moe_overlap.skill.rules.registry import all_rules
from moe_overlap.skill.rules.validate import validate_config

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OV = "comm_overlap.overlap_moe_expert_parallel_comm=true"
DW = "comm_overlap.delay_wgrad_compute=true"
GOOD_ENV = {"torch_version": "2.6.0", "te_version": "2.12.0", "gpu": "H100"}

# rule id -> (overrides that violate it, overrides that satisfy it, extra kwargs, megatron-core version)
# Both lists are applied on top of examples/ep-overlap-minimal.yaml (overlap on, EP 4, 64 experts, bf16).
CASES: dict[str, tuple[list[str], list[str], dict, str | None]] = {
    "ep-size-gt-1": (["model.expert_model_parallel_size=1"], ["model.expert_model_parallel_size=2"], {}, None),
    "num-experts-gt-1": (["model.num_moe_experts=1"], ["model.num_moe_experts=8"], {}, None),
    "dispatcher-alltoall-or-flex": (["model.moe_token_dispatcher_type=allgather"],
                                    ["model.moe_token_dispatcher_type=alltoall"], {}, None),
    "precision-bf16-or-fp16": (["model.bf16=false"], ["model.bf16=false", "model.fp16=true"], {}, None),
    "torch-min-2-6": ([], [], {"torch_version": "2.5.1"}, None),
    "pp-requires-vpp": (["model.pipeline_model_parallel_size=2"],
                        ["model.pipeline_model_parallel_size=2", "model.virtual_pipeline_model_parallel_size=2"],
                        {}, None),
    "no-full-recompute": (["model.recompute_granularity=full"], ["model.recompute_granularity=selective"], {}, None),
    "no-recompute-method": (["model.recompute_method=uniform"], ["model.recompute_method=null"], {}, None),
    "no-recompute-num-layers": (["model.recompute_num_layers=1"], [], {}, None),
    "no-moe-recompute-module": (["model.recompute_granularity=selective", "model.recompute_modules=[moe]"],
                                ["model.recompute_granularity=selective", "model.recompute_modules=[moe_act]"],
                                {}, "0.17.0"),
    "no-shared-expert-overlap": (["model.moe_shared_expert_overlap=true"], [], {}, None),
    "mtp-layers-limit": (["model.mtp_num_layers=2", "model.pipeline_model_parallel_size=2",
                          "model.virtual_pipeline_model_parallel_size=2"],
                         ["model.mtp_num_layers=1", "model.pipeline_model_parallel_size=2",
                          "model.virtual_pipeline_model_parallel_size=2"], {}, None),
    "mtp-requires-pp": (["model.mtp_num_layers=1"], ["model.mtp_num_layers=1", "model.pipeline_model_parallel_size=2",
                                                      "model.virtual_pipeline_model_parallel_size=2"], {}, "0.16.1"),
    "cuda-graph-scope-excludes-moe": (["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe]"],
                                      ["model.cuda_graph_impl=transformer_engine",
                                       "model.cuda_graph_scope=[attn, moe_router]"], {}, None),
    "ncclep-no-fc1-offload": (["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=ncclep",
                               "model.fine_grained_activation_offloading=true", "model.offload_modules=[expert_fc1]"],
                              ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=ncclep",
                               "model.fine_grained_activation_offloading=true", "model.offload_modules=[core_attn]"],
                              {}, "0.19.0"),
    "wgrad-requires-overlap": (["comm_overlap.overlap_moe_expert_parallel_comm=false", DW], [DW], {}, None),
    "wgrad-overlap-grad-reduce-te-2-7": ([DW, "ddp.overlap_grad_reduce=true"], [DW, "ddp.overlap_grad_reduce=true"],
                                         {"te_version": "2.6.0", "_good": {"te_version": "2.7.0"}}, None),
    "wgrad-grad-accum-fusion-te-2-7": ([DW, "model.gradient_accumulation_fusion=true"],
                                       [DW, "model.gradient_accumulation_fusion=false"], {"te_version": "2.6.0"}, None),
    "wgrad-cuda-graph-te-2-12": ([DW, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
                                  "model.gradient_accumulation_fusion=true"],
                                 [DW, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]",
                                  "model.gradient_accumulation_fusion=true", "model.add_bias_linear=false"],
                                 {}, "0.17.0"),
    "wgrad-cuda-graph-te-2-10": ([DW, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]"],
                                [DW, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]"],
                                {"te_version": "2.9.0", "_good": {"te_version": "2.10.0"}}, "0.19.2"),
    "wgrad-no-legacy-grouped-gemm": ([DW, "model.moe_use_legacy_grouped_gemm=true"], [DW], {}, "0.16.1"),
    "cuda-graph-whole-layer": (["model.cuda_graph_impl=transformer_engine"],
                               ["model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[attn]"], {},
                               "0.19.2"),
    "early-attn-release-needs-overlap": (["comm_overlap.overlap_moe_expert_parallel_comm=false",
                                          "model.ep_overlap_early_attn_memory_release=true"],
                                         ["model.ep_overlap_early_attn_memory_release=true"], {}, "0.17.1"),
    "fsdp-no-double-buffer": (["ddp.use_megatron_fsdp=true", "ddp.fsdp_double_buffer=true"],
                              ["ddp.use_megatron_fsdp=true"], {}, "0.18.2"),
    "fsdp-no-per-layer-cuda-graphs": (["ddp.use_megatron_fsdp=true", "model.cuda_graph_impl=local"],
                                      ["ddp.use_megatron_fsdp=true", "model.cuda_graph_impl=full_iteration"], {},
                                      "0.19.2"),
    "wgrad-overlap-grad-reduce-te-2-8": ([DW, "ddp.overlap_grad_reduce=true"], [DW, "ddp.overlap_grad_reduce=true"],
                                         {"te_version": "2.7.0", "_good": {"te_version": "2.8.0"}}, "0.17.1"),
    "wgrad-no-grad-accum-fusion-te-2-7": ([DW, "model.gradient_accumulation_fusion=false"],
                                          [DW, "model.gradient_accumulation_fusion=false"],
                                          {"te_version": "2.6.0", "_good": {"te_version": "2.7.0"}}, None),
    "wgrad-needs-te-layers": ([DW, "model.transformer_impl=local"], [DW, "model.transformer_impl=transformer_engine"],
                              {}, None),
    "wgrad-te-min-2-3": ([DW], [DW], {"te_version": "2.2.0", "_good": {"te_version": "2.3.0"}}, None),
    "dispatch-wgrad-excludes-ep-overlap": (["model.overlap_dispatch_backward_with_experts_wgrad=true"],
                                           ["comm_overlap.overlap_moe_expert_parallel_comm=false",
                                            "model.overlap_dispatch_backward_with_experts_wgrad=true"], {}, "0.18.2"),
    "dispatch-wgrad-te-2-3": (["comm_overlap.overlap_moe_expert_parallel_comm=false",
                               "model.overlap_dispatch_backward_with_experts_wgrad=true"],
                              ["comm_overlap.overlap_moe_expert_parallel_comm=false",
                               "model.overlap_dispatch_backward_with_experts_wgrad=true"],
                              {"te_version": "2.2.0", "_good": {"te_version": "2.3.0"}}, "0.19.2"),
    "dispatch-wgrad-excludes-delayed-wgrad": (["model.overlap_dispatch_backward_with_experts_wgrad=true", DW],
                                              ["model.overlap_dispatch_backward_with_experts_wgrad=true"], {},
                                              "0.18.2"),
    "deepep-flag-needs-flex": (["model.moe_enable_deepep=true"],
                               ["model.moe_enable_deepep=true", "model.moe_token_dispatcher_type=flex"], {}, None),
    "deepep-flag-excludes-hybridep": (["model.moe_enable_deepep=true", "model.moe_token_dispatcher_type=flex",
                                       "model.moe_flex_dispatcher_backend=hybridep"],
                                      ["model.moe_enable_deepep=true", "model.moe_token_dispatcher_type=flex"], {},
                                      "0.18.2"),
    "ncclep-needs-flex": (["model.moe_flex_dispatcher_backend=ncclep"],
                          ["model.moe_flex_dispatcher_backend=ncclep", "model.moe_token_dispatcher_type=flex"], {},
                          "0.19.2"),
    "ncclep-needs-core-0-19": (["model.moe_flex_dispatcher_backend=ncclep", "model.moe_token_dispatcher_type=flex"],
                               ["model.moe_flex_dispatcher_backend=deepep", "model.moe_token_dispatcher_type=flex"],
                               {}, "0.18.2"),
    "wgrad-not-in-first-rollout": ([DW], [], {}, None),
    "flex-backend-needs-flex-dispatcher": (["model.moe_flex_dispatcher_backend=deepep"],
                                           ["model.moe_flex_dispatcher_backend=deepep",
                                            "model.moe_token_dispatcher_type=flex"], {}, None),
    "flex-backend-gpu-support": (["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"],
                                 ["model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=hybridep"],
                                 {"gpu": "GB200"}, None),
    "cuda-device-max-connections": ([], [], {"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "1"},
                                             "_good": {"env": {"CUDA_DEVICE_MAX_CONNECTIONS": "32"}}}, None),
    "ep-divides-experts": (["model.expert_model_parallel_size=3"], ["model.expert_model_parallel_size=8"], {}, None),
    "single-micro-batch": (["train.global_batch_size=8", "train.micro_batch_size=8"],
                           ["train.global_batch_size=16", "train.micro_batch_size=2", "train.data_parallel_size=4"],
                           {}, None),
}
RULES = {r.id: r for r in all_rules()}


def _validate(overrides, kwargs, core, rule_id=None):
    kw = dict(GOOD_ENV) | {k: v for k, v in kwargs.items() if not k.startswith("_")}
    kw.setdefault("env", {})
    # Megatron-LM's argument checks are run for Megatron-LM argv only (a Bridge config never meets them).
    flavour = "megatron-lm" if rule_id and RULES[rule_id].mlm else None
    return validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=[OV, *overrides],
                           megatron_core_version=core or "0.16.1", detect=False, flavour=flavour, **kw)


def test_every_rule_has_cases():
    assert set(CASES) == set(RULES)


def test_rule_ids_equal_card_constraint_ids_both_ways():
    card_ids = [c.id for c in load_card("perf-expert-parallel-overlap").constraints]
    assert sorted(card_ids) == sorted(RULES), set(card_ids) ^ set(RULES)
    assert len(set(RULES)) == len(all_rules())


def test_card_severity_equals_rule_severity():
    """The card tells people how serious a constraint is; the validator must say the same."""
    card = {c.id: c.severity for c in load_card("perf-expert-parallel-overlap").constraints}
    mismatched = {rid: (card[rid], RULES[rid].severity) for rid in card if card[rid] != RULES[rid].severity}
    assert not mismatched, f"card vs validator severity differ: {mismatched}"


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires_on_violation(rule_id):
    bad, _good, kwargs, core = CASES[rule_id]
    result = _validate(bad, kwargs, core, rule_id)
    hits = [f for f in result.findings if f.rule == rule_id]
    assert hits, f"{rule_id} did not fire: {[f.rule for f in result.findings]}"
    assert hits[0].severity == RULES[rule_id].severity
    assert "{" not in hits[0].message and hits[0].fix and hits[0].source
    assert "could not be checked" not in hits[0].message
    assert result.valid is (RULES[rule_id].severity != "error" and not any(
        f.severity == "error" for f in result.findings))


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_passes_when_satisfied(rule_id):
    _bad, good, kwargs, core = CASES[rule_id]
    kwargs = {k: v for k, v in kwargs.items() if k != "_good"} | kwargs.get("_good", {})
    if rule_id in ("torch-min-2-6", "flex-backend-gpu-support"):
        kwargs = {k: v for k, v in kwargs.items() if k not in ("torch_version", "gpu")}
    if rule_id in ("wgrad-grad-accum-fusion-te-2-7",):
        kwargs = {}
    result = _validate(good, kwargs, core, rule_id)
    assert not [f for f in result.findings if f.rule == rule_id], result.findings


def test_rule_tables_are_well_formed():
    for rule in all_rules():
        assert rule.severity in ("error", "warning")
        assert rule.reads and rule.message and rule.fix and rule.source
        # An error is enforced by someone upstream; advice is a warning.
        assert rule.core is not None or rule.runtime is not None or rule.bridge or rule.severity == "warning", rule.id
        # The source names an upstream file and line (or, for advice, where the advice comes from).
        if rule.severity == "error":
            assert re.search(r"\.py:\d+", rule.source), rule.id


@pytest.mark.parametrize("rule_id,overrides,missing", [
    ("torch-min-2-6", [], "torch_version"),
    ("wgrad-overlap-grad-reduce-te-2-7", [DW, "ddp.overlap_grad_reduce=true"], "te_version"),
    ("flex-backend-gpu-support", ["model.moe_token_dispatcher_type=flex"], "gpu"),
])
def test_unknown_fact_warns_never_passes_silently(rule_id, overrides, missing):
    kwargs = {k: v for k, v in GOOD_ENV.items() if k != missing}
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=[OV, *overrides], detect=False,
                             megatron_core_version="0.16.1", env={}, **kwargs)
    hits = [f for f in result.findings if f.rule == rule_id]
    assert hits and hits[0].severity == "warning" and "could not be checked" in hits[0].message


def test_deepep_on_capability_10_needs_the_name():
    base = [OV, "model.moe_token_dispatcher_type=flex", "model.moe_flex_dispatcher_backend=deepep"]
    for gpu, expect in (("B200", None), ("10.0", "warning"), ("GB200", "error"), ("9.0", None), ("7.0", "error")):
        result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=base, detect=False, env={},
                                 torch_version="2.6.0", gpu=gpu)
        hits = [f.severity for f in result.findings if f.rule == "flex-backend-gpu-support"]
        assert hits == ([expect] if expect else []), gpu


def test_mtp_rules_follow_the_release():
    over = [OV, "model.mtp_num_layers=1"]
    by_core = {v: {f.rule for f in validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=over,
                                                    detect=False, env={}, megatron_core_version=v,
                                                    torch_version="2.6.0").findings} for v in ("0.16.1", "0.18.0")}
    assert "mtp-requires-pp" in by_core["0.16.1"] and "mtp-requires-pp" not in by_core["0.18.0"]
    zero = [OV, "model.mtp_num_layers=0"]
    for version, fires in (("0.17.0", True), ("0.19.0", False)):
        rules = {f.rule for f in validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=zero, detect=False,
                                                 env={}, megatron_core_version=version,
                                                 torch_version="2.6.0").findings}
        assert ("mtp-layers-limit" in rules) is fires, version


def test_rule_set_reports_core_and_bridge_rules():
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", detect=False, megatron_core_version="0.16.1",
                             torch_version="2.6.0", env={})
    rs = result.rule_set
    assert rs.name == "megatron-core 0.16" and rs.selected_by == "given"
    assert "torch-min-2-6" in rs.core_rules and "num-experts-gt-1" in rs.bridge_rules
    assert "no-moe-recompute-module" in rs.bridge_rules  # Core checks it only from 0.17
    assert "cuda-graph-whole-layer" in rs.runtime_rules and "single-micro-batch" in rs.advice_rules
    later = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", detect=False, megatron_core_version="0.17.1",
                            torch_version="2.6.0", env={}).rule_set
    assert "no-moe-recompute-module" in later.core_rules


@pytest.mark.parametrize("version,line,word", [("0.25.0", "0.19", "newer than the newest"),
                                               ("0.15", "0.16", "older than the oldest"),
                                               ("0.14.2", "0.16", "older than the oldest")])
def test_release_outside_the_known_range_warns(version, line, word):
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", detect=False, megatron_core_version=version,
                             torch_version="2.6.0", env={})
    assert result.rule_set.name == f"megatron-core {line}" and word in result.rule_set.note
    (hit,) = [f for f in result.findings if f.rule == "rule-set:outside-known-releases"]
    assert hit.severity == "warning" and f"rules of {line}" in hit.message and version in hit.message


def test_default_rule_set_is_stated(monkeypatch):
    from moe_overlap.skill.rules import versions

    monkeypatch.setattr(versions, "installed_version", lambda dist: None)
    result = validate_config(argv="--overlap-moe-expert-parallel-comm --expert-model-parallel-size 4 --num-experts 8 "
                             "--moe-token-dispatcher-type alltoall --bf16", detect=False, torch_version="2.6.0", env={})
    rs = result.rule_set
    assert rs.selected_by == "default" and rs.name == "megatron-core 0.19" and rs.flavour == "megatron-lm"
    assert rs.reason == "newest known release used, none given or implied"
    (hit,) = [f for f in result.findings if f.rule == "rule-set:default"]
    assert hit.severity == "info" and "0.19" in hit.message and "not installed" in hit.message
    assert result.valid


def test_bridge_config_implies_its_core_release(monkeypatch):
    """A Bridge 0.6 user runs Core 0.19.x: its rules, whatever megatron-core is installed here, and said so."""
    from moe_overlap.skill.rules import versions

    monkeypatch.setattr(versions, "installed_version", lambda dist: "0.16.1")
    rs = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", detect=False, torch_version="2.6.0", env={}).rule_set
    assert rs.selected_by == "implied" and rs.name == "megatron-core 0.19" and rs.flavour == "megatron-bridge"
    assert "Bridge 0.6.2 runs on megatron-core 0.19.x" in rs.reason and "core_v0.19.0" in rs.reason
    # Megatron-LM argv implies no release; the megatron-core pip installed beside this package is not taken as the
    # user's: the newest known release, and the note names what is installed
    argv = validate_config(argv="--bf16", detect=False, env={}).rule_set
    assert argv.selected_by == "default" and argv.name == "megatron-core 0.19" and argv.flavour == "megatron-lm"
    assert "0.16.1 is installed here" in argv.note and "--megatron-core-version 0.16.1" in argv.note
    given = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", detect=False, env={},
                            megatron_core_version="0.17.1").rule_set
    assert given.selected_by == "given" and given.name == "megatron-core 0.17" and "0.17.1" in given.reason


@pytest.mark.parametrize("name", ["ep-overlap-alltoall.yaml", "ep-overlap-minimal.yaml", "ep-overlap-flex-deepep.yaml"])
def test_seed_configs_clean_with_torch_2_6_and_fail_with_2_5(name):
    ok = validate_config(EXAMPLES / name, torch_version="2.6.0", te_version="2.7.0", gpu="H100", detect=False, env={})
    assert ok.valid and not [f for f in ok.findings if f.severity == "error"], ok.findings
    # Only the staged-rollout advice may remain (the alltoall seed turns delayed wgrad on).
    assert {f.rule for f in ok.findings} <= {"wgrad-not-in-first-rollout"}
    old = validate_config(EXAMPLES / name, torch_version="2.5.1", te_version="2.7.0", gpu="H100", detect=False, env={})
    assert not old.valid and {f.rule for f in old.findings if f.severity == "error"} == {"torch-min-2-6"}


def test_examples_are_plain_yaml_mappings():
    for path in EXAMPLES.glob("ep-overlap-*.yaml"):
        assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_cuda_graph_field_name_follows_the_release():
    def notes(model, version):
        result = validate_config({"model": model}, detect=False, env={}, megatron_core_version=version)
        return [f.fix for f in result.findings if f.rule == "config:renamed-field" and f.fix]

    assert notes({"cuda_graph_scope": ["attn"]}, "0.16.1") == []
    assert "cuda_graph_modules for megatron-core >= 0.18" in notes({"cuda_graph_scope": ["attn"]}, "0.18.0")[0]
    assert notes({"cuda_graph_modules": ["attn"]}, "0.19.0") == []
    assert any("cuda_graph_scope for megatron-core <= 0.17" in n for n in notes({"cuda_graph_modules": ["attn"]},
                                                                                 "0.16.1"))


def test_key_in_the_wrong_section_warns_and_is_read():
    """model.data_parallel_size belongs in comm_overlap: Bridge would not read it there, so the validator warns, and
    reads it so that the micro-batch count it was meant for is still checked."""
    config = {"model": {"expert_model_parallel_size": 4, "num_moe_experts": 64, "moe_token_dispatcher_type": "alltoall",
                        "bf16": True, "data_parallel_size": 8},
              "comm_overlap": {"overlap_moe_expert_parallel_comm": True},
              "train": {"global_batch_size": 8, "micro_batch_size": 1}}
    result = validate_config(config, detect=False, env={}, torch_version="2.6.0", megatron_core_version="0.19.2")
    rules = {f.rule: f for f in result.findings}
    wrong = rules["config:wrong-section"]
    assert wrong.severity == "warning" and wrong.path == "model.data_parallel_size"
    assert "belongs in comm_overlap" in wrong.message and "read here as comm_overlap.data_parallel_size" in wrong.message
    assert "single-micro-batch" in rules  # 8 / (1 x 8) = one micro-batch per rank
    fixed = validate_config({**config, "model": {k: v for k, v in config["model"].items() if k != "data_parallel_size"},
                             "comm_overlap": {"overlap_moe_expert_parallel_comm": True, "data_parallel_size": 8}},
                            detect=False, env={}, torch_version="2.6.0", megatron_core_version="0.19.2")
    assert "config:wrong-section" not in {f.rule for f in fixed.findings}
    assert "single-micro-batch" in {f.rule for f in fixed.findings}
    both = validate_config({**config, "comm_overlap": {"overlap_moe_expert_parallel_comm": True,
                                                       "data_parallel_size": 1}},
                           detect=False, env={}, torch_version="2.6.0", megatron_core_version="0.19.2")
    assert "also set and wins" in next(f for f in both.findings if f.rule == "config:wrong-section").message


def test_field_of_another_release_warns():
    over = [OV, "model.overlap_dispatch_backward_with_experts_wgrad=false", "model.cuda_graph_impl=full_iteration"]
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=over, detect=False, env={},
                             torch_version="2.6.0", megatron_core_version="0.17.1")
    hits = [f for f in result.findings if f.rule == "config:field-not-in-release"]
    assert [h.path for h in hits] == ["model.cuda_graph_impl"] and "from megatron-core 0.18" in hits[0].message
    legacy = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=[OV, "model.moe_use_legacy_grouped_gemm=true"],
                             detect=False, env={}, torch_version="2.6.0", megatron_core_version="0.19.2")
    assert [f.path for f in legacy.findings if f.rule == "config:field-not-in-release"] == [
        "model.moe_use_legacy_grouped_gemm"]
    assert "wgrad-no-legacy-grouped-gemm" not in {f.rule for f in legacy.findings}


@pytest.mark.parametrize("version,impl,scope,fires", [
    ("0.16.1", "local", "[attn]", True), ("0.17.1", "local", "[attn]", True), ("0.18.2", "local", "[attn]", False),
    ("0.19.2", "full_iteration", "[]", False), ("0.17.1", "full_iteration", "[]", True),
    ("0.19.2", "transformer_engine", "[attn, moe]", True), ("0.18.2", "transformer_engine", "[moe_router]", False),
])
def test_cuda_graph_rule_follows_the_release(version, impl, scope, fires):
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=[
        OV, f"model.cuda_graph_impl={impl}", f"model.cuda_graph_scope={scope}"], detect=False, env={},
        torch_version="2.6.0", megatron_core_version=version)
    assert ("cuda-graph-scope-excludes-moe" in {f.rule for f in result.findings}) is fires


@pytest.mark.parametrize("version", ["0.16.1", "0.17.1", "0.18.2", "0.19.2"])
def test_te_2_10_graph_check_holds_in_every_release(version):
    over = [OV, DW, "model.cuda_graph_impl=transformer_engine", "model.cuda_graph_scope=[moe_router]"]
    result = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=over, detect=False, env={},
                             torch_version="2.6.0", te_version="2.9.0", megatron_core_version=version)
    assert "wgrad-cuda-graph-te-2-10" in result.rule_set.core_rules
    assert "wgrad-cuda-graph-te-2-10" in {f.rule for f in result.findings if f.severity == "error"}


def test_argv_flags_of_the_new_checks():
    result = validate_config(argv="--overlap-moe-expert-parallel-comm --expert-model-parallel-size 4 --num-experts 8 "
                                  "--moe-token-dispatcher-type alltoall --bf16 --delay-wgrad-compute "
                                  "--transformer-impl local --use-megatron-fsdp --fsdp-double-buffer",
                             detect=False, env={}, torch_version="2.6.0", te_version="2.12.0",
                             megatron_core_version="0.19.2")
    errors = {f.rule for f in result.findings if f.severity == "error"}
    assert {"wgrad-needs-te-layers", "fsdp-no-double-buffer"} <= errors


def test_te_2_12_rule_reads_the_scope_whatever_the_graph_implementation():
    """Bridge's check looks at the graph modules even with cuda_graph_impl none (has_cuda_graph_module,
    megatron-bridge 0.6.2 comm_overlap.py:538-548), so a leftover attn scope still needs TE >= 2.12."""
    over = [OV, DW, "model.cuda_graph_scope=[attn]", "model.gradient_accumulation_fusion=true",
            "model.add_bias_linear=false"]
    old = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=over, detect=False, env={},
                          torch_version="2.6.0", te_version="2.11.0", megatron_core_version="0.19.2")
    assert "wgrad-cuda-graph-te-2-12" in {f.rule for f in old.findings if f.severity == "error"}
    new = validate_config(EXAMPLES / "ep-overlap-minimal.yaml", overrides=over, detect=False, env={},
                          torch_version="2.6.0", te_version="2.12.0", megatron_core_version="0.19.2")
    assert "wgrad-cuda-graph-te-2-12" not in {f.rule for f in new.findings}
