"""Megatron-LM itself as the oracle of `validate --argv`, for every release the rules know (0.16.1-0.19.2).

For each release, 400 generated ``pretrain_gpt.py`` command lines (every overlap-related flag and the flags they
interact with: PP and the three VPP forms, --num-layers, recompute, CUDA graphs and their scope spellings, TE,
MTP, FP8, fusion, dispatcher/backends, delayed wgrad, precision, CUDA_DEVICE_MAX_CONNECTIONS) go through that
release's own ``parse_args -> validate_args -> core_transformer_config_from_args`` in a child process
(tests/oracle/mlm_driver.py) and through our validator with that release's Megatron-LM rule set. Every
rejection must be matched by an error of the rule its message belongs to; every acceptance must get no error but
from the rules listed as advisory (tests/oracle/mlm.py ADVISORY, with the reason). A rejection for a reason no
rule knows fails the test, so a generator bug cannot hide as agreement. 0.16.1's megatron/training is not on the
registry: its verdicts were recorded from the core_v0.16.1 tag and are replayed where the tag is not unpacked.
"""

from __future__ import annotations

import json
import os

import pytest

from moe_overlap.skill.config.argv import FLAG_RELEASES, FLAGS
from moe_overlap.skill.rules.registry import rules_for
from tests.oracle import mlm, releases


def _need(version: str) -> None:
    if releases.is_unpacked(version) and (releases.has_mlm_training(version) or mlm.recording(version).is_file()):
        return
    why = (f"megatron-core {version} is not unpacked in {releases.release_dir(version)} (`make oracle-releases`)"
           if not releases.is_unpacked(version) else f"no Megatron-LM {version} arguments.py nor its recording")
    if os.environ.get(releases.REQUIRED_ENV):
        pytest.fail(why)
    pytest.skip(why)


@pytest.mark.parametrize("version", releases.RELEASES)
def test_megatron_lm_agrees_with_validate_argv(version):
    _need(version)
    r = mlm.run_oracle(version)
    assert r.argv == mlm.N_ARGV >= 400
    assert not r.unrelated, f"{len(r.unrelated)} rejections by checks no rule knows, first: {r.unrelated[0]}"
    assert not r.disagreements, f"{len(r.disagreements)} disagreements, first: {r.disagreements[0]}"
    assert r.accepted >= 100 and r.rejected >= 100, (r.accepted, r.rejected)
    # The checks the issue is about decided rejections: VPP (incl. VPP 1 -> None), layer splits, the TE checks.
    assert {"pp-requires-vpp", "config:layer-split", "wgrad-needs-te-layers", "wgrad-no-grad-accum-fusion-te-2-7",
            "wgrad-overlap-grad-reduce-te-2-8", "ep-size-gt-1", "precision-bf16-or-fp16"} <= r.rules_seen
    if version != "0.16.1":
        assert "wgrad-cuda-graph-te-2-12" in r.rules_seen  # Megatron-LM checks it from 0.17
    if r.live:
        assert r.mlm_file.startswith(str(releases.mlm_training_root(version))), r.mlm_file  # that release's code


@pytest.mark.parametrize("version", releases.RELEASES)
def test_advisory_rules_are_listed_with_a_reason(version):
    line = releases.line(version)
    for rule in rules_for(line):
        if rule.id in mlm.ADVISORY:
            assert rule.kind(line) != "core" and mlm.ADVISORY[rule.id], rule.id
    # Advisory rules are Megatron-Core's later asserts, never a Bridge-only check (those are not run on argv).
    assert not {r.id for r in rules_for(line) if r.id in mlm.ADVISORY and not r.for_flavour("megatron-lm", line)}


def test_recorded_verdicts_name_their_source():
    data = json.loads(mlm.recording("0.16.1").read_text())
    assert data["source"].startswith("Megatron-LM core_v0.16.1 55ac7082517c3878ae653c07c09c534b8aed49f6")
    assert len(data["results"]) == mlm.N_ARGV
    assert data["results_digest"] == mlm.digest(mlm._payload(mlm.cases("0.16.1")))
    assert data["scripts_digest"] == mlm.digest(mlm.script_payload("0.16.1"))


def test_docs_list_the_advisory_rules():
    """docs/oracle-megatron-lm.md's table names exactly the rules ADVISORY lists."""
    doc = (mlm.RECORDED.parents[2] / "docs" / "oracle-megatron-lm.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| `") and "|" in line[2:]]
    listed = {line.split("`")[1] for line in rows if not line.startswith("| `megatron")}
    assert listed == set(mlm.ADVISORY)


@pytest.mark.parametrize("version", releases.RELEASES)
def test_flags_read_are_flags_of_the_release(version):
    """Every mapped flag is in the release's own parser exactly where FLAG_RELEASES says it is (else Megatron-LM
    stops with 'unrecognized arguments' and validate must say so)."""
    _need(version)
    theirs = mlm.parser_flags(version)
    line = releases.line(version)
    for flag in set(FLAGS) - {"--data-parallel-size"}:
        first, last = FLAG_RELEASES.get(flag, (None, None))
        expected = not ((first and line < first) or (last and line > last))
        assert (flag in theirs) == expected, (flag, version)
