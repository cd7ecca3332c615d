#!/usr/bin/env python3
"""Run the skill's own evals the way users use the skill (skills/<name>/evals/PROTOCOL.md).

    python tools/skill_eval.py prepare --out DIR     # prompts for both arms, a copy of the skill without evals/
    # ... the answering assistants write DIR/answers/<arm>/qNN.json ...
    python tools/skill_eval.py blind --out DIR       # DIR/grading/blind.md + grades.json: answers shuffled, anonymised
    # ... the grader fills DIR/grading/grades.json ...
    python tools/skill_eval.py tally --out DIR       # pass / partial / fail per arm, characters of skill read

The key that maps anonymous items back to arms is DIR/key.json; the grader never needs it. Exit codes: 0 ok,
2 usage or input error (a missing answer or grade is named).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SKILL = ROOT / "skills" / "perf-expert-parallel-overlap"
ARMS = ("with-skill", "without-skill")
GRADES = ("pass", "partial", "fail")
RUBRIC = {
    "pass": "every expectation met and nothing in the answer contradicts the ground truth",
    "partial": "the core of the ground truth is there, but an expectation is missed, or a secondary statement is wrong",
    "fail": "the main point is missing or wrong, or (should-not-trigger items) EP-overlap advice is pulled in",
}
# Names that would tell the grader which arm an answer came from; replaced in the blind file.
_REVEALING = re.compile(r"(?:\.\./)?(?:references/[\w.-]+\.md|SKILL\.md|card\.yaml|evals/[\w./-]+)(?:#[\w-]+)?")


class EvalError(Exception):
    """Bad input: the message names what is missing and how to fix it (exit 2)."""


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EvalError(f"{path} does not exist") from None
    except json.JSONDecodeError as exc:
        raise EvalError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _qid(case_id: int) -> str:
    return f"q{case_id:02d}"


# ---- prepare ----------------------------------------------------------------------------------------------

def _attached(case: dict, skill: Path, out: Path) -> str:
    if not case.get("files"):
        return ""
    parts = ["", "## Files the user attached", ""]
    for rel in case["files"]:
        src = skill / rel
        dest = out / "inputs" / _qid(case["id"]) / Path(rel).name
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, dest)
        parts += [f"`{dest}`:", "", "```", src.read_text(encoding="utf-8").rstrip(), "```", ""]
    return "\n".join(parts)


def _prompt(case: dict, arm: str, skill_copy: Path, answer: Path, attached: str) -> str:
    qid = _qid(case["id"])
    head = [f"# Eval question {qid} ({arm} arm)", "",
            "You are an AI coding assistant answering a user. Answer the question below as you would for that user:",
            "concrete, with the settings, versions and commands they need. This file is all you are given.", "",
            "## The question", "", case["prompt"].strip(), attached, "## How to answer", ""]
    if arm == "with-skill":
        rules = [
            f"- An agent skill is installed at `{skill_copy}`. Use it as an assistant uses a skill: read its",
            "  `SKILL.md` first, then only the files it points to that the question needs. You may run the",
            "  `moe-overlap` commands it names if they are installed. Read nothing else on disk and use no web.",
            "- Record every read of a file of the skill folder: its path relative to the skill folder and the",
            "  characters you read (a whole file: `\"whole\": true` and its size as `wc -m` counts it; part of a",
            "  file: the characters of that part). Record every command with the characters of its output.",
            "- Decide from the skill's description whether it applies to the question, as an assistant does.",
        ]
        example = {"id": case["id"], "arm": arm, "answer": "...",
                   "reads": [{"path": "SKILL.md", "chars": 9000, "whole": True}],
                   "commands": [{"command": "moe-overlap ...", "output_chars": 1200}]}
    else:
        rules = ["- Answer from what you know. Do not open files (other than those attached above), run commands or",
                 "  search the web. Leave `reads` and `commands` empty."]
        example = {"id": case["id"], "arm": arm, "answer": "...", "reads": [], "commands": []}
    tail = ["", f"Write your answer to `{answer}` as one JSON document (UTF-8):", "", "```json",
            json.dumps(example, indent=2), "```", "",
            "`answer` is the full reply to the user, in Markdown. Do not mention this file or the eval in it.", ""]
    return "\n".join(head + rules + tail)


def prepare(out: Path, skill: Path = DEFAULT_SKILL, evals: Path | None = None) -> dict:
    evals = evals or skill / "evals" / "evals.json"
    data = _read_json(evals)
    if out.exists() and any(out.iterdir()):
        raise EvalError(f"{out} is not empty: give a new --out folder")
    skill_copy = (out / "skill" / skill.name).resolve()
    shutil.copytree(skill, skill_copy, ignore=lambda d, names: ["evals"] if Path(d) == skill else [])
    questions = []
    for case in data["evals"]:
        qid = _qid(case["id"])
        attached = _attached(case, skill, out)
        entry = {"id": case["id"], "qid": qid, "name": case["name"], "should_trigger": case.get("should_trigger", True),
                 "prompts": {}, "answers": {}}
        for arm in ARMS:
            answer = (out / "answers" / arm / f"{qid}.json").resolve()
            answer.parent.mkdir(parents=True, exist_ok=True)
            prompt = out / "prompts" / arm / f"{qid}.md"
            prompt.parent.mkdir(parents=True, exist_ok=True)
            prompt.write_text(_prompt(case, arm, skill_copy, answer, attached), encoding="utf-8")
            entry["prompts"][arm], entry["answers"][arm] = str(prompt.resolve()), str(answer)
        questions.append(entry)
    truth = {c["id"]: {k: c.get(k) for k in ("prompt", "ground_truth", "expectations", "source")}
             for c in data["evals"]}
    manifest = {"skill": data["skill_name"], "skill_copy": str(skill_copy), "evals": str(evals.resolve()),
                "arms": list(ARMS), "questions": questions}
    _write_json(out / "manifest.json", manifest)
    _write_json(out / "grading" / "truth.json", truth)
    return manifest


# ---- blind ------------------------------------------------------------------------------------------------

def _answer(path: Path, case_id: int, arm: str) -> dict:
    data = _read_json(path)
    if data.get("id") != case_id or data.get("arm") != arm or not isinstance(data.get("answer"), str):
        raise EvalError(f"{path}: needs id {case_id}, arm {arm!r} and an answer string")
    return data


def blind(out: Path, seed: int = 0) -> dict:
    manifest = _read_json(out / "manifest.json")
    truth = _read_json(out / "grading" / "truth.json")
    missing = [p for q in manifest["questions"] for p in q["answers"].values() if not Path(p).is_file()]
    if missing:
        raise EvalError(f"{len(missing)} answer(s) missing, e.g. {missing[0]}")
    rng = random.Random(seed)
    key, items, lines = {}, [], ["# Blind grading", "",
                                 "Grade each answer against the ground truth and expectations of its question:", ""]
    lines += [f"- **{g}**: {RUBRIC[g]}" for g in GRADES]
    lines += ["", "Fill `grades.json` in this folder (one grade per item). Answers are shown in random order; "
              "nothing says how they were produced.", ""]
    for q in manifest["questions"]:
        arms = list(ARMS)
        rng.shuffle(arms)
        t = truth[str(q["id"])]
        lines += [f"## {q['qid']}: {q['name']}", "", "**Question.** " + t["prompt"], "",
                  "**Ground truth.** " + t["ground_truth"], "", "**Expectations.**", ""]
        lines += [f"- {e}" for e in t["expectations"]]
        lines += ["", f"Source: {t['source']}"]
        if not q["should_trigger"]:
            lines += ["", "*Should not trigger*: the answer must stay out of EP-overlap advice."]
        for label, arm in zip("AB", arms, strict=True):
            item = f"{q['qid']}-{label}"
            key[item] = {"id": q["id"], "arm": arm}
            text = _REVEALING.sub("[reference]", _answer(Path(q["answers"][arm]), q["id"], arm)["answer"])
            lines += ["", f"### Answer {item}", "", text.strip()]
            items.append({"item": item, "grade": None, "note": ""})
        lines.append("")
    grading = out / "grading"
    grading.mkdir(parents=True, exist_ok=True)
    (grading / "blind.md").write_text("\n".join(lines), encoding="utf-8")
    _write_json(grading / "grades.json", {"rubric": RUBRIC, "grades": items})
    _write_json(out / "key.json", {"seed": seed, "items": key})
    return key


# ---- tally ------------------------------------------------------------------------------------------------

def _chars_read(answer: dict, skill_copy: Path) -> int:
    """Characters of skill material read: a whole file counts its real size, a part what was recorded (at most
    the file's size); command output counts too (it is skill material the assistant read)."""
    total = 0
    for read in answer.get("reads") or []:
        path = (skill_copy / str(read.get("path", ""))).resolve()
        size = len(path.read_text(encoding="utf-8")) if path.is_file() and path.is_relative_to(skill_copy) else None
        recorded = int(read.get("chars") or 0)
        total += size if (read.get("whole") and size is not None) else min(recorded, size or recorded)
    total += sum(int(c.get("output_chars") or 0) for c in answer.get("commands") or [])
    return total


def tally(out: Path) -> dict:
    manifest = _read_json(out / "manifest.json")
    key = _read_json(out / "key.json")["items"]
    grades = {g["item"]: g.get("grade") for g in _read_json(out / "grading" / "grades.json")["grades"]}
    bad = sorted(i for i in key if grades.get(i) not in GRADES)
    if bad:
        raise EvalError(f"{len(bad)} item(s) without a pass/partial/fail grade: {', '.join(bad[:8])}")
    questions = {q["id"]: q for q in manifest["questions"]}
    skill_copy = Path(manifest["skill_copy"])
    result = {}
    for arm in ARMS:
        counts = {"all": dict.fromkeys(GRADES, 0), "should_trigger": dict.fromkeys(GRADES, 0),
                  "should_not_trigger": dict.fromkeys(GRADES, 0)}
        chars = []
        for item, where in key.items():
            if where["arm"] != arm:
                continue
            q = questions[where["id"]]
            counts["all"][grades[item]] += 1
            counts["should_trigger" if q["should_trigger"] else "should_not_trigger"][grades[item]] += 1
            chars.append(_chars_read(_answer(Path(q["answers"][arm]), q["id"], arm), skill_copy))
        n = sum(counts["all"].values())
        result[arm] = {**counts, "questions": n, "pass_rate": round(counts["all"]["pass"] / n, 3) if n else 0.0,
                       "mean_chars_read": round(sum(chars) / len(chars)) if chars else 0,
                       "max_chars_read": max(chars, default=0)}
    return result


def _text(result: dict) -> str:
    lines = [f"{'arm':<14} {'pass':>5} {'partial':>8} {'fail':>5} {'pass %':>7}  {'no-trigger p/pa/f':>18}"
             f"  {'mean chars':>10} {'max chars':>10}"]
    for arm, r in result.items():
        neg = r["should_not_trigger"]
        lines.append(f"{arm:<14} {r['all']['pass']:>5} {r['all']['partial']:>8} {r['all']['fail']:>5} "
                     f"{100 * r['pass_rate']:>6.1f}%  {neg['pass']:>6}/{neg['partial']}/{neg['fail']:<9}"
                     f"  {r['mean_chars_read']:>10} {r['max_chars_read']:>10}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    p = sub.add_parser("prepare", help="write the prompts of both arms and the skill copy")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--skill", type=Path, default=DEFAULT_SKILL, help="the skill folder (default: this repo's)")
    p.add_argument("--evals", type=Path, help="the evals file (default: the skill's evals/evals.json)")
    b = sub.add_parser("blind", help="the blind grading file, once every answer is written")
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--seed", type=int, default=0)
    t = sub.add_parser("tally", help="pass / partial / fail per arm and characters read, once graded")
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--format", choices=("text", "json"), default="text")
    args = ap.parse_args(argv)
    try:
        if args.step == "prepare":
            m = prepare(args.out, args.skill.resolve(), args.evals)
            print(f"{len(m['questions'])} questions x {len(ARMS)} arms: prompts in {args.out / 'prompts'}; "
                  f"skill copy (no evals/) in {m['skill_copy']}")
        elif args.step == "blind":
            key = blind(args.out, args.seed)
            print(f"{len(key)} answers in {args.out / 'grading' / 'blind.md'}; grade them in grades.json there")
        else:
            result = tally(args.out)
            print(json.dumps(result) if args.format == "json" else _text(result))
    except EvalError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
