"""`verify --judge` of a `--launcher slurm` folder keeps the report's `cluster_job`: the launcher records the job
in the folder (cluster_job.json), the offline judge reads it back with the run folder's bounds; a damaged
record costs a note, never a traceback (torch-free, no Slurm: the Slurm commands are faked; the real ones run in
tests/slurm/)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from moe_overlap.verify.judge.offline import judge_run_dir
from moe_overlap.verify.judge.report_model import CLUSTER_JOB_FILE, MAX_CLUSTER_JOB_BYTES
from moe_overlap.verify.plan.options import VerifyOptions
from moe_overlap.verify.run import slurm_job, slurm_run

TEMPLATE = Path(__file__).resolve().parents[1] / "data" / "runfolder"  # verify --steps 3 on 2 CPU ranks
JOB = {"scheduler": "slurm", "job_id": "4242", "state": "COMPLETED", "nodes": ["node1"], "exit_code": "0:0",
       "script": "/shared/run/job.sbatch", "output": None}


@pytest.fixture(autouse=True)
def _no_drawing(monkeypatch):
    from moe_overlap.verify.judge import report

    monkeypatch.setattr(report, "plot_losses", lambda report, path: "loss.png skipped (test)")


def _folder(tmp_path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(TEMPLATE, run)
    (run / "report.json").unlink()
    return run


def _fake_slurm(monkeypatch, calls: list[str]):
    """sbatch "runs" the job by putting a finished run's files where its ranks would write them."""

    def submit(script: Path) -> str:
        calls.append("submit")
        out = script.parent
        assert not (out / CLUSTER_JOB_FILE).exists()  # nothing recorded before the job exists
        for name in ("plan.json", "config.json"):
            shutil.copy(TEMPLATE / name, out / name)
        shutil.copytree(TEMPLATE / "ranks", out / "ranks", dirs_exist_ok=True)
        shutil.copytree(TEMPLATE / "logs", out / "logs", dirs_exist_ok=True)
        (out / "slurm-4242.out").write_text("torchrun agent output\n")
        return "4242"

    def job_state(job_id):
        calls.append("state")
        return slurm_job.JobState(job_id=job_id, state="COMPLETED", nodes=["node1"], exit_code="0:0")

    def cancel(job_id, **_):
        calls.append("cancel")
        return slurm_job.JobState(job_id=job_id, state="CANCELLED")

    monkeypatch.setattr(slurm_job, "require_client", lambda: None)
    monkeypatch.setattr(slurm_job, "submit", submit)
    monkeypatch.setattr(slurm_job, "job_state", job_state)
    monkeypatch.setattr(slurm_job, "in_queue", lambda job_id: False)
    monkeypatch.setattr(slurm_job, "cancel", cancel)


def test_rejudging_a_slurm_folder_keeps_its_cluster_job(tmp_path, monkeypatch):
    calls: list[str] = []
    _fake_slurm(monkeypatch, calls)
    out = tmp_path / "run"
    first = slurm_run.run_on_slurm(VerifyOptions(launcher="slurm", nproc=2, device="cpu", steps=3, out=out))
    assert "submit" in calls and "cancel" not in calls
    job = first.cluster_job.model_dump()
    assert job["job_id"] == "4242" and job["state"] == "COMPLETED" and job["nodes"] == ["node1"]
    assert job["output"] == str(out.resolve() / "slurm-4242.out")
    assert json.loads((out / CLUSTER_JOB_FILE).read_text()) == job  # the folder's own record of it
    again = judge_run_dir(out)  # what `moe-overlap verify --judge OUT` runs
    assert again.cluster_job is not None and again.cluster_job.model_dump() == job
    assert json.loads((out / "report.json").read_text())["cluster_job"] == job
    assert not any("cluster job" in n for n in again.notes)
    assert again.verdict == first.verdict


def test_the_job_is_recorded_at_submission(tmp_path, monkeypatch):
    """The tracker stops right after sbatch (killed, the login node gone): --judge still names the job."""
    calls: list[str] = []
    _fake_slurm(monkeypatch, calls)

    def gone(job_id):
        raise SystemExit("the tracker is stopped at its first squeue")

    monkeypatch.setattr(slurm_job, "job_state", gone)
    with pytest.raises(SystemExit):
        slurm_run.run_on_slurm(VerifyOptions(launcher="slurm", nproc=2, device="cpu", steps=3, out=tmp_path / "run"))
    rec = json.loads((tmp_path / "run" / CLUSTER_JOB_FILE).read_text())
    assert rec["job_id"] == "4242" and rec["state"] == "SUBMITTED"
    report = judge_run_dir(tmp_path / "run")
    assert report.cluster_job.job_id == "4242" and report.cluster_job.state == "SUBMITTED"
    assert any("only as submitted" in n and "sacct -j 4242" in n for n in report.notes)


def test_a_folder_without_a_record_has_no_cluster_job(tmp_path):
    report = judge_run_dir(_folder(tmp_path))
    assert report.cluster_job is None and not any("cluster job" in n for n in report.notes)


def _damage(run: Path, kind: str, outside: Path) -> None:
    path = run / CLUSTER_JOB_FILE
    if kind == "garbage":
        path.write_bytes(b'{"job_id": "4242", "st')
    elif kind == "nonutf8":
        path.write_bytes(b"\xff\xfe{}")
    elif kind == "oversized":
        path.write_text(json.dumps({**JOB, "nodes": ["n" * 100] * (MAX_CLUSTER_JOB_BYTES // 100)}))
    elif kind == "wrong-field":
        path.write_text(json.dumps({**JOB, "job_id": 4242}))
    elif kind == "escape-id":
        path.write_text(json.dumps({**JOB, "job_id": "42\x1b]0;owned\x07"}))
    elif kind == "extra-field":
        path.write_text(json.dumps({**JOB, "cmd": "rm -rf /"}))
    elif kind == "nan":
        path.write_text(json.dumps(JOB).replace('"0:0"', "NaN"))
    elif kind == "link":
        (outside / "job.json").write_text(json.dumps(JOB))
        path.symlink_to(outside / "job.json")
    elif kind == "dir":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)


@pytest.mark.parametrize("kind,words", [
    ("garbage", "JSON"), ("nonutf8", "UTF-8"), ("oversized", "bytes"), ("wrong-field", "job_id"),
    ("extra-field", "cmd"), ("escape-id", "job_id"), ("nan", "NaN"), ("link", "symbolic link"), ("dir", "directory"), ("fifo", "FIFO")])
def test_a_damaged_record_is_a_note_and_the_run_is_judged(tmp_path, kind, words):
    run, outside = _folder(tmp_path), tmp_path / "outside"
    outside.mkdir()
    _damage(run, kind, outside)
    report = judge_run_dir(run)
    assert report.cluster_job is None and report.runs and report.verdict
    note = next(n for n in report.notes if n.startswith("the cluster job is not named"))
    assert CLUSTER_JOB_FILE in note and words.lower() in note.lower(), note


def test_the_cli_judges_a_damaged_record_without_a_traceback(tmp_path, capsys):
    from moe_overlap.cli import main

    run = _folder(tmp_path)
    (run / CLUSTER_JOB_FILE).write_text("[" * 5000)
    code = main(["verify", "--judge", str(run), "--format", "json"])
    cap = capsys.readouterr()
    assert code in (0, 1) and "Traceback" not in cap.out + cap.err
    assert json.loads(cap.out)["out_dir"]
    assert any(n.startswith("the cluster job is not named")
               for n in json.loads((run / "report.json").read_text())["notes"])


def test_a_folder_that_cannot_take_the_record_costs_a_note(tmp_path):
    (tmp_path / CLUSTER_JOB_FILE).mkdir()
    notes: list[str] = []
    slurm_run.save_job_record(tmp_path, JOB, notes)
    slurm_run.save_job_record(tmp_path, JOB, notes)
    assert len(notes) == 1 and "will not name the job" in notes[0] and "folder sits" in notes[0]


def test_force_clears_an_earlier_record():
    from moe_overlap.verify.plan.outdir import OUTPUT_FILES

    assert CLUSTER_JOB_FILE in OUTPUT_FILES  # a new run into the folder never inherits the old job
