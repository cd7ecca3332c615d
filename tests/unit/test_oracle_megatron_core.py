"""megatron-core as an oracle, for every release the rules know (0.16.1, 0.17.1, 0.18.2, 0.19.2).

For each release, 600 generated configs over every overlap-related field are built with that release's own
``TransformerConfig`` (in a child process whose path starts with the unpacked release, tests/oracle/) and checked
by our validator with that release's rule set. On the rules the release's TransformerConfig enforces, the two
verdicts must agree on every config. A rejection whose message belongs to no check the rules know fails the
test, so a generator bug cannot hide as agreement. The rules TransformerConfig does not enforce (Megatron-Bridge,
later runtime asserts, Megatron-LM's argument checks) are intentional differences, each listed with its reason
in tests/oracle/run.py. `make oracle-releases` unpacks the releases; `make test` requires them.
"""

from __future__ import annotations

import os

import pytest

from moe_overlap.skill.rules.registry import rules_for
from tests.oracle import releases
from tests.oracle.run import INTENTIONAL, N_CONFIGS, run_oracle

# Core rules that by construction never decide a rejection alone (another Core check always fires too).
NEVER_ALONE = {
    "no-full-recompute": "Core pairs full recompute with a recompute_method, so no-recompute-method fires with it",
    "dispatch-wgrad-excludes-delayed-wgrad": "delayed wgrad needs the overlap and the dispatch option excludes it, "
                                             "so wgrad-requires-overlap or dispatch-wgrad-excludes-ep-overlap fires too",
}


def _need(version: str) -> None:
    if releases.is_unpacked(version):
        return
    where = releases.release_dir(version)
    if os.environ.get(releases.REQUIRED_ENV):
        pytest.fail(f"megatron-core {version} is not unpacked in {where}: run `make oracle-releases`")
    pytest.skip(f"megatron-core {version} not unpacked in {where} (`make oracle-releases`)")


@pytest.mark.parametrize("version", releases.RELEASES)
def test_oracle_agrees_with_the_release_on_every_core_check(version):
    _need(version)
    r = run_oracle(version)
    assert r.configs == N_CONFIGS >= 400
    assert r.core_file.startswith(str(releases.release_dir(version))), r.core_file  # that release, not another
    assert not r.unrelated, f"{len(r.unrelated)} rejections by checks the rules do not know, first: {r.unrelated[0]}"
    assert not r.disagreements, f"{len(r.disagreements)} disagreements, first: {r.disagreements[0]}"
    # Both verdicts occur often enough for agreement to mean something.
    assert r.accepted >= 100 and r.rejected >= 100, (r.accepted, r.rejected)
    # Every rule this release's TransformerConfig checks was, at least once, the only reason for a rejection.
    assert r.core_rules - set(NEVER_ALONE) <= r.sole_reason, sorted(r.core_rules - set(NEVER_ALONE) - r.sole_reason)


@pytest.mark.parametrize("version", releases.RELEASES)
def test_intentional_differences_are_listed_with_a_reason_and_occur(version):
    _need(version)
    r = run_oracle(version)
    not_core = {rule.id for rule in rules_for(releases.line(version))
                if rule.severity == "error" and rule.kind(releases.line(version)) != "core"}
    assert not_core <= set(INTENTIONAL), sorted(not_core - set(INTENTIONAL))
    assert set(r.intentional) <= not_core
    # The differences do show up: configs Core accepts that a non-TransformerConfig rule rejects.
    assert {"num-experts-gt-1", "flex-backend-gpu-support", "cuda-graph-whole-layer"} <= set(r.intentional)
