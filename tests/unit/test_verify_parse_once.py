"""One verification's config goes one way: into skill/config/ once (one parse into OverlapConfig), through
verify/'s config module once (read and mapped once into VerifyConfig), and every mode is validated from that
parse (skill.rules.validate.validate_parsed), never from a source parsed again.

The counters wrap every binding of the functions in every loaded moe_overlap module (`from x import f` copies
the name), so a new call site anywhere is counted too.
"""

from __future__ import annotations

import sys

import pytest

from moe_overlap.paths import data_root
from moe_overlap.skill.config import model as skill_model
from moe_overlap.skill.config.model import OverlapConfig, parse_config
from moe_overlap.skill.rules import validate as skill_validate
from moe_overlap.skill.rules.validate import validate_config, validate_parsed
from moe_overlap.verify.plan import config as verify_config
from moe_overlap.verify.plan.build import make_plan, validate_modes
from moe_overlap.verify.plan.options import MODES, VerifyOptions

COUNTED = {
    "skill.parse_config": (skill_model, "parse_config"),
    "skill.validate_config": (skill_validate, "validate_config"),
    "skill.validate_parsed": (skill_validate, "validate_parsed"),
    "verify.load_verify_config": (verify_config, "load_verify_config"),
    "verify.map_megatron": (verify_config, "map_megatron"),
    "verify.read_source": (verify_config, "read_source"),
}

FLAT_MEGATRON = {"expert_model_parallel_size": 2, "num_moe_experts": 8, "moe_router_topk": 2, "bf16": True,
                 "overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True, "hidden_size": 2048}
OWN = {"format": "moe-overlap", "num_moe_experts": 4, "precision": "bf16", "steps": 4}


@pytest.fixture()
def calls(monkeypatch):
    counts = dict.fromkeys(COUNTED, 0)
    for key, (module, name) in COUNTED.items():
        original = getattr(module, name)

        def counted(*a, _key=key, _fn=original, **kw):
            counts[_key] += 1
            return _fn(*a, **kw)

        for loaded in list(sys.modules.values()):
            if (getattr(loaded, "__name__", "") or "").startswith("moe_overlap") and \
                    getattr(loaded, name, None) is original:
                monkeypatch.setattr(loaded, name, counted)
    return counts


@pytest.mark.parametrize("source,kind", [
    (None, "default"),
    (OWN, "moe-overlap"),
    (FLAT_MEGATRON, "megatron"),
    ("examples/ep-overlap-alltoall.yaml", "megatron"),
    ("examples/ep-overlap-flex-deepep.yaml", "megatron"),
    ("examples/ep-overlap-minimal.yaml", "megatron"),
], ids=["default", "own-dict", "flat-megatron", "alltoall.yaml", "flex-deepep.yaml", "minimal.yaml"])
def test_one_verification_parses_its_config_once(tmp_path, calls, source, kind):
    if isinstance(source, str):
        source = str(data_root() / source)
    plan = make_plan(VerifyOptions(config=source, out=tmp_path / "o", nproc=1, modes=list(MODES)))
    evidence = validate_modes(plan)
    overlap_modes = [s.name for s in plan.specs if s.overlap]
    assert plan.config_kind == kind
    assert overlap_modes and set(evidence["results"]) == set(overlap_modes)
    assert isinstance(plan.megatron, OverlapConfig)
    assert calls == {
        "skill.parse_config": 1,  # the one parse into the skill's model
        "skill.validate_config": 0,  # the validator that parses its input is not used
        "skill.validate_parsed": len(overlap_modes),  # one validation per overlap mode, from that parse
        "verify.load_verify_config": 1,  # verify's config module: one pass from source to VerifyConfig
        "verify.map_megatron": 1 if kind == "megatron" else 0,
        "verify.read_source": 0 if source is None else 1,
    }, calls


def test_the_counters_see_a_second_parse(tmp_path, calls):
    """The counting can fail: validating a mode from the source again is two parses."""
    plan = make_plan(VerifyOptions(config=dict(FLAT_MEGATRON), out=tmp_path / "o", nproc=1))
    skill_validate.validate_config(plan.raw_source)
    assert calls["skill.parse_config"] == 2 and calls["skill.validate_config"] == 1


@pytest.mark.parametrize("name", ["ep-overlap-alltoall.yaml", "ep-overlap-flex-deepep.yaml",
                                  "ep-overlap-minimal.yaml"])
def test_validate_config_is_parse_then_validate_parsed(name):
    """The old entry point stays for callers with a source; it is exactly one parse plus validate_parsed."""
    path = str(data_root() / "examples" / name)
    kw = {"torch_version": "2.6.0", "te_version": "2.7.0", "gpu": "H100", "megatron_core_version": "0.16.1",
          "env": {}, "detect": False}
    overrides = ["comm_overlap.delay_wgrad_compute=false"]
    direct = validate_config(path, overrides=overrides, **kw)
    parsed = parse_config(path, overrides)
    assert validate_parsed(parsed, **kw).model_dump() == direct.model_dump()
    assert validate_parsed(parsed, **kw).model_dump() == direct.model_dump()  # the parse is not consumed
