"""The run-folder reader and writer (verify/rundir): what a hostile folder holds never escapes it."""

from __future__ import annotations

import os

import pytest
from pydantic import BaseModel

from moe_overlap.verify.rundir.read import RunFolderError, read_json, read_model, read_records, read_text
from moe_overlap.verify.rundir.strict_json import StrictJSONError, loads
from moe_overlap.verify.rundir.write import write_text


class _M(BaseModel):
    n: int
    xs: list[float]


@pytest.mark.parametrize("text,why", [("NaN", "NaN"), ('{"a": Infinity}', "Infinity"), ("1e309", "range"),
                                      ("9" * 5000, "digits"), ("[" * 100000 + "]" * 100000, "nested"),
                                      ("[" * 70 + "]" * 70, "nested"), ("{", "not valid JSON")])
def test_strict_json_refuses_with_its_own_words(text, why):
    with pytest.raises(StrictJSONError, match=why):
        loads(text)


def test_strict_json_non_utf8():
    with pytest.raises(StrictJSONError, match="not UTF-8"):
        loads(b'{"a": "\xff"}')


def test_reader_refuses_links_fifos_devices_dirs(tmp_path):
    outside = tmp_path / "secret.json"
    outside.write_text('{"n": 1, "xs": []}')
    run = tmp_path / "run"
    run.mkdir()
    (run / "link.json").symlink_to(outside)
    (run / "sub").symlink_to(tmp_path)
    (run / "zero").symlink_to("/dev/zero")
    (run / "loop").symlink_to(run / "loop")
    (run / "dir.json").mkdir()
    os.mkfifo(run / "fifo.json")
    for name, why in (("link.json", "symbolic link"), ("sub/secret.json", "out of the run folder"),
                      ("zero", "symbolic link"), ("loop", "symbolic link"), ("dir.json", "directory"),
                      ("fifo.json", "FIFO")):
        with pytest.raises(RunFolderError, match=why):
            read_json(run, name)


def test_reader_validates_naming_file_and_field(tmp_path):
    (tmp_path / "a.json").write_text('{"n": 1, "xs": 2.5}')
    with pytest.raises(RunFolderError, match=r"a\.json: xs: .*list"):
        read_model(tmp_path, "a.json", _M)
    (tmp_path / "big.json").write_text("0" * 100)
    with pytest.raises(RunFolderError, match="limit"):
        read_json(tmp_path, "big.json", max_bytes=10)


def test_symlinked_folder_is_read(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "a.json").write_text('{"n": 1, "xs": [1]}')
    (tmp_path / "alias").symlink_to(real)
    assert read_model(tmp_path / "alias", "a.json", _M).n == 1


def test_records_skip_damaged_lines(tmp_path):
    (tmp_path / "r.jsonl").write_bytes(b'{"kind":"step","t":1,"loss":NaN}\n{"kind":"x","t":"no"}\n\xff\n'
                                       b'{"kind":"y","t":' + b"9" * 5000 + b'}\n[1]\n{"kind":"done","t":2}\n{"kin')
    recs = read_records(tmp_path, "r.jsonl")
    assert [r["kind"] for r in recs] == ["step", "done"]


def test_log_reader_bounded(tmp_path):
    (tmp_path / "log").write_bytes(b"a" * 1000 + b"\xff")
    text = read_text(tmp_path, "log", max_bytes=100)
    assert len(text) < 200 and "left out" in text


def test_writer_replaces_links_never_follows(tmp_path):
    outside = tmp_path / "victim.md"
    outside.write_text("keep")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.md").symlink_to(outside)
    (run / "report.json").symlink_to(tmp_path / "created-elsewhere.json")
    write_text(run, "report.md", "new")
    write_text(run, "report.json", "{}")
    assert outside.read_text() == "keep" and not (tmp_path / "created-elsewhere.json").exists()
    assert (run / "report.md").read_text() == "new" and not (run / "report.md").is_symlink()
    (run / "loss.png").mkdir()
    with pytest.raises(RunFolderError, match="folder sits"):
        write_text(run, "loss.png", "x")
    assert sorted(p.name for p in run.iterdir()) == ["loss.png", "report.json", "report.md"]
