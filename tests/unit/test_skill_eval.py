"""tools/skill_eval.py on a tiny skill: prepare writes self-contained prompts for both arms and a skill copy without
the answers, blind shuffles and anonymises the answers, tally counts grades per arm and the characters read."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("skill_eval", ROOT / "tools" / "skill_eval.py")
se = importlib.util.module_from_spec(_spec)
sys.modules["skill_eval"] = se
_spec.loader.exec_module(se)

SKILL_MD = "---\nname: tiny\ndescription: a tiny skill\n---\n\n# Tiny\n\nRead [references/a.md](references/a.md).\n"
REF = "# A\n\nThe answer is 42.\n"
CASES = [
    {"id": 1, "name": "the-answer", "prompt": "What is the answer?", "ground_truth": "GROUND-TRUTH-ONE is 42.",
     "expected_output": "says 42", "expectations": ["Says 42"], "files": [], "topics": ["mechanism"],
     "families": [], "rule_ids": [], "source": "upstream a.py:3"},
    {"id": 2, "name": "read-the-log", "prompt": "Why did it fail?", "ground_truth": "GROUND-TRUTH-TWO: a typo.",
     "expected_output": "finds the typo", "expectations": ["Finds the typo"], "files": ["evals/files/run.log"],
     "topics": ["failure-reading"], "families": [], "rule_ids": [], "source": "upstream x.py:1"},
    {"id": 3, "name": "not-mine", "prompt": "How do I tune TP overlap?", "ground_truth": "GROUND-TRUTH-THREE.",
     "expected_output": "stays out", "expectations": ["Does not use the skill"], "files": [],
     "topics": ["out-of-scope"], "families": [], "rule_ids": [], "source": "elsewhere y.py:2",
     "should_trigger": False},
]


@pytest.fixture
def skill(tmp_path) -> Path:
    root = tmp_path / "tiny"
    (root / "references").mkdir(parents=True)
    (root / "evals" / "files").mkdir(parents=True)
    (root / "SKILL.md").write_text(SKILL_MD, encoding="utf-8")
    (root / "references" / "a.md").write_text(REF, encoding="utf-8")
    (root / "evals" / "files" / "run.log").write_text("AssertionError: LOG-LINE\n", encoding="utf-8")
    (root / "evals" / "evals.json").write_text(json.dumps({"skill_name": "tiny", "evals": CASES}), encoding="utf-8")
    return root


def _answer(out: Path, qid: str, arm: str, reads=(), commands=()):
    path = out / "answers" / arm / f"{qid}.json"
    token = "ALPHA" if arm == "with-skill" else "BETA"
    path.write_text(json.dumps({"id": int(qid[1:]), "arm": arm, "answer": f"answer {qid} {token}, see references/a.md",
                                "reads": list(reads), "commands": list(commands)}), encoding="utf-8")


def test_prepare_writes_self_contained_prompts_and_hides_the_answers(skill, tmp_path):
    out = tmp_path / "run"
    assert se.main(["prepare", "--skill", str(skill), "--out", str(out)]) == 0
    copy = out / "skill" / "tiny"
    assert (copy / "SKILL.md").is_file() and (copy / "references" / "a.md").is_file()
    assert not (copy / "evals").exists()  # the answering assistant must not find the ground truth
    for arm in se.ARMS:
        for case in CASES:
            text = (out / "prompts" / arm / f"q{case['id']:02d}.md").read_text(encoding="utf-8")
            assert case["prompt"] in text and "GROUND-TRUTH" not in text
            assert str((out / "answers" / arm / f"q{case['id']:02d}.json").resolve()) in text
            assert (str(copy.resolve()) in text) == (arm == "with-skill")
    with_log = (out / "prompts" / "without-skill" / "q02.md").read_text(encoding="utf-8")
    assert "AssertionError: LOG-LINE" in with_log and (out / "inputs" / "q02" / "run.log").is_file()
    assert "whole" in (out / "prompts" / "with-skill" / "q01.md").read_text(encoding="utf-8")
    assert se.main(["prepare", "--skill", str(skill), "--out", str(out)]) == 2  # never overwrites a run


def test_blind_shuffles_and_anonymises_then_tally_counts(skill, tmp_path, capsys):
    out = tmp_path / "run"
    se.prepare(out, skill)
    assert se.main(["blind", "--out", str(out)]) == 2  # answers missing: named, not a traceback
    assert "missing" in capsys.readouterr().err
    whole = [{"path": "SKILL.md", "chars": 1, "whole": True}]  # a wrong count for a whole file is corrected
    part = [{"path": "references/a.md", "chars": 5}]
    for qid in ("q01", "q02", "q03"):
        _answer(out, qid, "with-skill", reads=whole + part, commands=[{"command": "x", "output_chars": 10}])
        _answer(out, qid, "without-skill")
    key = se.blind(out, seed=3)
    text = (out / "grading" / "blind.md").read_text(encoding="utf-8")
    assert "with-skill" not in text and "without-skill" not in text and "references/a.md" not in text
    assert "GROUND-TRUTH-ONE" in text and "Should not trigger" in text
    assert {(v["id"], v["arm"]) for v in key.values()} == {(i, a) for i in (1, 2, 3) for a in se.ARMS}
    orders = {se.blind(out, seed=s)["q01-A"]["arm"] for s in range(8)}
    assert orders == set(se.ARMS)  # the order of the two answers is random, not by arm
    key = se.blind(out, seed=3)
    grades = json.loads((out / "grading" / "grades.json").read_text(encoding="utf-8"))
    assert {g["item"] for g in grades["grades"]} == set(key) and all(g["grade"] is None for g in grades["grades"])
    with pytest.raises(se.EvalError, match="without a pass/partial/fail grade"):
        se.tally(out)
    wanted = {(1, "with-skill"): "pass", (2, "with-skill"): "pass", (3, "with-skill"): "partial",
              (1, "without-skill"): "partial", (2, "without-skill"): "fail", (3, "without-skill"): "pass"}
    for g in grades["grades"]:
        where = key[g["item"]]
        g["grade"] = wanted[(where["id"], where["arm"])]
    (out / "grading" / "grades.json").write_text(json.dumps(grades), encoding="utf-8")
    result = se.tally(out)
    assert result["with-skill"]["all"] == {"pass": 2, "partial": 1, "fail": 0}
    assert result["without-skill"]["all"] == {"pass": 1, "partial": 1, "fail": 1}
    assert result["with-skill"]["should_not_trigger"] == {"pass": 0, "partial": 1, "fail": 0}
    assert result["with-skill"]["mean_chars_read"] == len(SKILL_MD) + 5 + 10
    assert result["without-skill"]["mean_chars_read"] == 0
    assert se.main(["tally", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "with-skill" in table and "66.7%" in table


def test_prepare_on_the_real_skill(tmp_path):
    manifest = se.prepare(tmp_path / "run")
    assert len(manifest["questions"]) >= 25
    assert sum(not q["should_trigger"] for q in manifest["questions"]) >= 4
    assert not (Path(manifest["skill_copy"]) / "evals").exists()
