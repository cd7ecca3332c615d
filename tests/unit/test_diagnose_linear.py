"""diagnose's matching is linear in the text and bounded: adversarial texts up to the MCP cap (64 KiB) answer in
well under a second (issue 34: 'deepep none ' * 666 took 29 s with the regular-expression matcher)."""

import time

import pytest

from moe_overlap.skill.diagnose import api, textmatch
from moe_overlap.skill.diagnose.modes import DiagnoseDataError, mode_set

CAP = 64 * 1024
ADVERSARIAL = {
    "issue-34": "deepep none " * 666,
    "deepep-none-64k": ("deepep none " * 6000)[:CAP],
    "near-miss-gaps": ("deepep is not " * 6000)[:CAP],  # every gapped deepep ... not ... used pattern nearly fits
    "repeated-keywords": (" ".join(["overlap_moe_expert_parallel_comm", "hang", "deepep", "hybridep", "timeout",
                                    "moe_a2a_overlap", "no", "speedup", "alltoall"]) + " ") * 700,
    "one-long-line": "x" * CAP,
    "one-token-per-char": "a " * (CAP // 2),
    "operators": "<>= " * (CAP // 4),
    "many-lines": ("hang\n" * (CAP // 5)),
    "dump-lines": ("moe_flex_dispatcher_backend ........ deepep\n" * 1500)[:CAP],
    "non-ascii": "错误 DeepEP 超时 ümlaut ∑ 🚀 " * 2000,
    "kebab": ("ep-size-gt-1-" * 6000)[:CAP],
    "prefixes": ("regressionregression deadlocked overlapping " * 1500)[:CAP],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
def test_adversarial_text_answers_fast(name):
    text = ADVERSARIAL[name][:CAP]
    api.diagnose("warm up the compiled mode set")
    start = time.perf_counter()
    result = api.diagnose(text)
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, (name, elapsed)
    assert result.verdict in ("ep-overlap-failure", "not-an-ep-overlap-failure")


def test_non_utf8_text_gives_a_json_result(capsys):
    import json

    from moe_overlap.cli import main

    r = api.diagnose("DeepEP error: timeout (dispatch CPU) \udcff\ud800")
    assert r.matches[0].failure_mode == "deepep-dispatch-timeout"
    r.model_dump_json()
    assert main(["diagnose", "\udcff hang \ud800", "--format", "json"]) in (0, 1)
    json.loads(capsys.readouterr().out)


def test_cost_grows_linearly():
    """8x the text costs far less than 64x the time (quadratic growth would): the trie walk is per token."""
    unit = "deepep is not used because the hybridep all_gather_into_tensor hangs " * 60
    api.diagnose(unit)

    def timed(text):
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            api.diagnose(text)
            best = min(best, time.perf_counter() - start)
        return best

    small, large = timed(unit), timed(unit * 8)
    assert large < max(small, 1e-3) * 24, (small, large)


def test_pattern_syntax():
    toks = textmatch.tokens("DeepEP error: timeout (dispatch CPU)\nnum_moe_experts ........ 64\ntorch version < 2.6.0")
    assert toks[:6] == ["deepep", "error", "timeout", "dispatch", "cpu", "torch"]  # the dump line is dropped
    assert "<" in toks
    pats = [textmatch.parse(p) for p in ("deepep ... dispatch|combine cpu", "torch version < 2 6", "dead*",
                                         "timeout ... deepep", "num_moe_experts")]
    found = textmatch.Matcher(pats).find(toks + ["deadlocked"])
    assert found == [True, True, True, False, False]


def test_gap_is_bounded():
    m = textmatch.Matcher([textmatch.parse("deepep ... timeout")])
    near = ["deepep"] + ["w"] * textmatch.GAP + ["timeout"]
    far = ["deepep"] + ["w"] * (textmatch.GAP + 1) + ["timeout"]
    assert m.find(near) == [True] and m.find(far) == [False]


@pytest.mark.parametrize("bad", ["speed-up", "a ... ...", "... a", "a ...", "", "x|" * 3])
def test_bad_patterns_are_refused_with_the_pattern_named(bad):
    with pytest.raises(textmatch.PatternError) as err:
        textmatch.parse(bad)
    assert repr(bad) in str(err.value)


def test_every_pattern_of_the_data_compiles_and_names_are_unique():
    ms = mode_set()
    names = [m.name for m in ms.modes]
    assert len(names) == len(set(names))
    assert all(m.sources for m in ms.modes if m.name.startswith(("deepep-", "hybridep-", "shared-event")))


def test_malformed_data_file_is_a_clear_error(tmp_path, monkeypatch):
    import shutil

    from moe_overlap.skill.card import cards
    from moe_overlap.skill.diagnose import modes

    root = tmp_path / "skills"
    shutil.copytree(cards.skill_dir(cards.DEFAULT_SKILL), root / cards.DEFAULT_SKILL)
    data = root / cards.DEFAULT_SKILL / modes.DATA_FILE
    data.write_text(data.read_text(encoding="utf-8").replace("  no-speedup:\n", "  no-such-mode:\n", 1),
                    encoding="utf-8")
    monkeypatch.setattr(cards, "skills_dir", lambda: root)
    cards.load_card.cache_clear() if hasattr(cards.load_card, "cache_clear") else None
    modes.mode_set.cache_clear()
    try:
        with pytest.raises(DiagnoseDataError, match="no-such-mode"):
            modes.mode_set()
    finally:
        modes.mode_set.cache_clear()
        cards.load_card.cache_clear() if hasattr(cards.load_card, "cache_clear") else None
