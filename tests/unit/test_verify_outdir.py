"""A verification run owns its output folder (issue 15): it never loses a file it did not write, never writes
through a link, and never reads an earlier run's records (nothing is launched here)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from moe_overlap.verify.plan.build import VerifyInputError, make_plan, prepare_out
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.plan.outdir import MARKER, OutDirError, check, claim, earlier_outputs


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir/link>")
            for p in sorted(folder.rglob("*"))}


def _earlier_run(folder: Path) -> None:
    """What a killed run of ours leaves: marker, config, records ending in an error, a mode log."""
    (folder / "ranks").mkdir(parents=True)
    (folder / "logs" / "overlap").mkdir(parents=True)
    (folder / MARKER).write_text("{}")
    (folder / "config.json").write_text("{}")
    (folder / "ranks" / "rank0.jsonl").write_text(json.dumps({"kind": "error", "t": 1.0, "traceback": "old"}) + "\n")
    (folder / "ranks" / "rank1.out").write_text("old output\n")
    (folder / "logs" / "overlap" / "rank0.log").write_text("old log\n")


def test_another_tools_folder_is_refused_even_with_force(tmp_path):
    (tmp_path / "config.json").write_text('{"theirs": true}')
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "app.log").write_text("theirs\n")
    (tmp_path / "report.md").write_text("theirs\n")
    (tmp_path / "report.json").write_text("{}")
    before = _tree(tmp_path)
    for force in (False, True):
        with pytest.raises(VerifyInputError, match="not made by a moe-overlap run") as err:
            prepare_out(make_plan(VerifyOptions(out=tmp_path, force=force)))
        assert err.value.field == "out" and "new or empty folder" in err.value.fix
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("where", ["/", "~"])
def test_root_and_home_are_refused(where):
    with pytest.raises(OutDirError, match="filesystem root|home folder"):
        check(Path(where).expanduser(), force=True)


def test_an_empty_folder_is_taken_and_marked(tmp_path):
    plan = make_plan(VerifyOptions(out=tmp_path))
    config = prepare_out(plan)
    assert (tmp_path / MARKER).is_file() and config == tmp_path.resolve() / "config.json"
    assert (tmp_path / "ranks").is_dir() and (tmp_path / "logs").is_dir()
    marker = json.loads((tmp_path / MARKER).read_text())
    assert marker["tool"] == "moe-overlap verify" and marker["run_id"] == plan.run_id


def test_a_new_folder_is_created(tmp_path):
    out = tmp_path / "a" / "b"
    prepare_out(make_plan(VerifyOptions(out=out)))
    assert (out / MARKER).is_file()


def test_a_killed_runs_folder_needs_force_and_force_removes_only_our_files(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    (tmp_path / "logs" / "my-analysis.csv").write_text("a,b\n")
    with pytest.raises(VerifyInputError, match="earlier run's outputs"):
        make_plan(VerifyOptions(out=tmp_path))
    prepare_out(make_plan(VerifyOptions(out=tmp_path, force=True)))
    assert (tmp_path / "notes.txt").read_text() == "mine\n"
    assert (tmp_path / "logs" / "my-analysis.csv").read_text() == "a,b\n"
    assert not (tmp_path / "ranks" / "rank0.jsonl").exists() and not (tmp_path / "ranks" / "rank1.out").exists()
    assert not (tmp_path / "logs" / "overlap").exists()
    assert json.loads((tmp_path / "config.json").read_text())["format"] == "moe-overlap"  # the new run's
    assert earlier_outputs(tmp_path) == ["config.json"]


def test_records_are_never_appended_to(tmp_path):
    from moe_overlap.verify.run.records import RecordWriter

    path = tmp_path / "rank0.jsonl"
    path.write_text('{"kind": "error", "t": 1}\n')
    with pytest.raises(FileExistsError):
        RecordWriter(path)


def test_something_foreign_at_a_name_the_ranks_write_is_refused(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "ranks" / "rank3.out").mkdir()  # not a file a run wrote: never removed
    (tmp_path / "ranks" / "rank3.out" / "theirs.txt").write_text("keep\n")
    with pytest.raises(VerifyInputError, match="not written by a moe-overlap run"):
        prepare_out(make_plan(VerifyOptions(out=tmp_path, force=True)))
    assert (tmp_path / "ranks" / "rank3.out" / "theirs.txt").read_text() == "keep\n"


def test_foreign_files_beside_ours_stay_and_do_not_block(tmp_path):
    _earlier_run(tmp_path)
    (tmp_path / "ranks" / "theirs.txt").write_text("keep\n")
    prepare_out(make_plan(VerifyOptions(out=tmp_path, force=True)))
    assert (tmp_path / "ranks" / "theirs.txt").read_text() == "keep\n"


@pytest.mark.parametrize("name", ["logs", "ranks", "report.json", "config.json"])
def test_a_symlink_where_a_run_writes_is_never_followed(tmp_path, name):
    out, target = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    target.mkdir()
    (target / "precious.txt").write_text("keep\n")
    (out / MARKER).write_text("{}")
    os.symlink(target if name in ("logs", "ranks") else target / "precious.txt", out / name)
    for force in (False, True):
        with pytest.raises(VerifyInputError, match="symbolic link"):
            prepare_out(make_plan(VerifyOptions(out=out, force=force)))
    assert (target / "precious.txt").read_text() == "keep\n" and os.listdir(target) == ["precious.txt"]


def test_a_file_as_out_is_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(VerifyInputError, match="not a folder"):
        make_plan(VerifyOptions(out=tmp_path / "f"))


def test_claim_refuses_between_check_and_claim(tmp_path):
    """Something appears in the folder after planning: claim checks again and refuses."""
    plan = make_plan(VerifyOptions(out=tmp_path))
    (tmp_path / "theirs.txt").write_text("x")
    with pytest.raises(VerifyInputError, match="not made by a moe-overlap run"):
        prepare_out(plan)
    with pytest.raises(OutDirError):
        claim(tmp_path, force=True, run_id="x")
