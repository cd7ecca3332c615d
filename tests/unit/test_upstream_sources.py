"""Every upstream line a rule cites (moe_overlap/skill/rules/sources.py) holds the message it names, in every
unpacked megatron-core release and in the Megatron-Bridge 0.6.2 wheel (`make oracle-releases`)."""

from __future__ import annotations

import re

import pytest

from moe_overlap.skill.rules import sources
from moe_overlap.skill.rules.registry import all_rules
from tests.oracle import releases
from tests.oracle.fetch import bridge_dir
from tests.unit.test_oracle_megatron_core import _need

BRIDGE_MARKERS = {  # a word that must appear in the cited Bridge span
    "ep": "expert_model_parallel_size > 1", "experts": "num_moe_experts > 1", "dispatcher": "'alltoall' or 'flex'",
    "precision": "bf16 or fp16", "torch": "2.6.0", "vpp": "virtual_pipeline_model_parallel_size",
    "full-recompute": "full recomputation", "recompute-method": "recomputation method",
    "recompute-layers": "recompute_num_layers must be None", "moe-recompute": "disable moe in recompute_modules",
    "shared-overlap": "moe_shared_expert_overlap", "mtp": "MTP supports at most one layer",
    "wgrad-grad-reduce-te": "required for overlap_grad_reduce", "wgrad-fusion-te": "for gradient_accumulation_fusion",
    "wgrad-overlap": "is required for delay_wgrad_compute", "wgrad-graph": "does not support attention bias",
    "flex-apply": "def apply_flex_dispatcher_backend", "flex-validate": "def validate_flex_dispatcher_backend",
}


@pytest.mark.parametrize("version", releases.RELEASES)
def test_core_lines_hold_their_messages(version):
    _need(version)
    checked = 0
    for check, (path, text, lines) in sources.CORE.items():
        file = releases.release_dir(version) / path
        if version not in lines or not file.is_file():
            continue
        line = file.read_text(encoding="utf-8").splitlines()[lines[version] - 1]
        assert text in line, f"{check}: {path}:{lines[version]} in {version} reads {line.strip()!r}"
        checked += 1
    assert checked >= 20


def test_bridge_spans_hold_their_checks():
    if not (bridge_dir() / sources.BRIDGE_CO).is_file():
        import os

        if os.environ.get(releases.REQUIRED_ENV):
            pytest.fail(f"megatron-bridge 0.6.2 is not unpacked in {bridge_dir()}: run `make oracle-releases`")
        pytest.skip("megatron-bridge 0.6.2 not unpacked (`make oracle-releases`)")
    for check, (path, first, last) in sources.BRIDGE.items():
        text = "\n".join((bridge_dir() / path).read_text(encoding="utf-8").splitlines()[first - 1:last])
        assert BRIDGE_MARKERS[check] in text, (check, first, last, text)


def test_no_check_is_claimed_where_its_message_is_absent():
    """A release the table leaves out of a check must not carry its message either (no silent omission)."""
    present = [v for v in releases.RELEASES if releases.is_unpacked(v)]
    if not present:
        _need(releases.RELEASES[0])
    for check, (path, text, lines) in sources.CORE.items():
        for version in present:
            file = releases.release_dir(version) / path
            if version in lines or not file.is_file():
                continue
            assert text not in file.read_text(encoding="utf-8"), f"{check} is in {version} but not in the table"


def test_every_error_rule_cites_upstream_lines():
    for rule in all_rules():
        if rule.severity == "error":
            assert re.search(r"\.py:\d+", rule.source), rule.id
