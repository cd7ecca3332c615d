"""`verify --launcher slurm` against a real Slurm (conftest.py brings it up on this host): a 2-rank CPU
verification submitted, tracked and judged; jobs stopped by Ctrl-C, by --timeout and by the MCP
cancel_verification, each leaving nothing in squeue and no process behind."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time

import anyio
import pytest

from tests.distributed._verify_util import assert_no_orphans, assert_report_valid, new_token
from tests.slurm.conftest import in_queue

pytestmark = pytest.mark.slow
SMALL = ["--nproc", "2", "--device", "cpu", "--micro-batches", "2", "--modes", "baseline,overlap", "--no-explain"]


def _verify(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", "--launcher", "slurm", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_a_two_rank_run_is_submitted_tracked_and_judged(slurm, tmp_path, monkeypatch):
    token = new_token(monkeypatch)  # sbatch exports the environment: the job's processes carry it too
    out = tmp_path / "run"
    res = _verify(*SMALL, "--steps", "2", "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    job_id = re.search(r"Slurm job (\d+): SUBMITTED", res.stderr).group(1)
    assert f"Slurm job {job_id}: RUNNING on {slurm}" in res.stderr  # tracked: squeue/scontrol
    assert "baseline step 2/2" in res.stderr and "overlap step 2/2" in res.stderr  # the ranks' records
    assert f"Slurm job {job_id}: COMPLETED on {slurm} exit 0:0" in res.stderr
    assert "verdict: throughput-not-judged" in res.stderr  # cpu: every judged criterion passed
    assert f"Slurm job {job_id}: COMPLETED on {slurm}, exit 0:0" in res.stdout  # the summary names the job
    report = assert_report_valid(out)
    assert report["verdict"] == "throughput-not-judged"
    assert report["cluster_job"]["job_id"] == job_id and report["cluster_job"]["state"] == "COMPLETED"
    assert report["cluster_job"]["nodes"] == [slurm] and report["cluster_job"]["exit_code"] == "0:0"
    # judged again from the folder alone: the job it records (cluster_job.json) stays in the report
    again = subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", "--judge", str(out)],
                           capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr[-2000:]
    assert assert_report_valid(out)["cluster_job"] == report["cluster_job"]
    assert f"Slurm job {job_id}: COMPLETED on {slurm}, exit 0:0" in again.stdout
    # the submitted script is the one --print-launch slurm prints for the same run
    submitted = (out / "job.sbatch").read_text()
    printed = subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", *SMALL, "--steps", "2",
                              "--print-launch", "slurm", "--out", str(out), "--force"],
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.strip() == submitted.strip()
    assert not in_queue(job_id)
    assert_no_orphans(token)


def _submitted_job(proc: subprocess.Popen, until: str) -> str:
    """Read the run's progress lines until one contains `until`; return the job id."""
    job_id = None
    for line in proc.stderr:
        m = re.search(r"Slurm job (\d+): SUBMITTED", line)
        job_id = job_id or (m.group(1) if m else None)
        if until in line:
            return job_id
    raise AssertionError(f"the run ended before {until!r}")


def test_ctrl_c_scancels_the_job(slurm, tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.cli", "verify", "--launcher", "slurm", *SMALL,
                             "--steps", "300", "--out", str(out)], stderr=subprocess.PIPE, text=True)
    try:
        job_id = _submitted_job(proc, " step ")  # training on the node
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not in_queue(job_id)
    report = assert_report_valid(out)
    assert report["verdict"] == "cancelled" and "Ctrl-C" in report["failure"]["message"]
    assert report["cluster_job"]["job_id"] == job_id and report["cluster_job"]["state"] == "CANCELLED"
    assert_no_orphans(token)


def test_timeout_scancels_the_job(slurm, tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    t0 = time.monotonic()
    res = _verify(*SMALL, "--steps", "300", "--timeout", "4", "--out", str(out), "--format", "json")
    assert res.returncode == 1, res.stderr[-3000:]
    assert json.loads(res.stdout)["summary"]["verdict"] == "timeout"
    report = assert_report_valid(out)
    assert report["cluster_job"]["state"] == "CANCELLED" and not in_queue(report["cluster_job"]["job_id"])
    assert time.monotonic() - t0 < 120
    assert_no_orphans(token)


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_mcp_run_and_cancel_verification(slurm, tmp_path, monkeypatch):
    from moe_overlap.server import ServerOptions, build_server
    from tests.mcp.conftest import connect, text_of

    token = new_token(monkeypatch)
    srv = build_server(ServerOptions(allowed_dirs=[str(tmp_path)], runs_dir=str(tmp_path / "runs")))
    run = {"nproc": 2, "micro_batches": 2, "modes": ["baseline", "overlap"], "launcher": "slurm",
           "slurm": {"nodes": 1, "gpus_per_node": 2, "time": "00:10:00"}}
    try:
        async with connect(srv, "legacy") as client:
            messages: list[str] = []

            async def on_progress(done, total, message):
                messages.append(message or "")

            done = await client.call_tool("run_verification", {**run, "steps": 2}, progress_callback=on_progress)
            assert not done.is_error, text_of(done)
            result = done.structured_content
            assert result["state"] == "succeeded" and result["summary"]["verdict"] == "throughput-not-judged"
            report = json.loads((tmp_path / "runs").joinpath(result["out_dir"]).joinpath("report.json").read_text())
            job_id = report["cluster_job"]["job_id"]
            assert report["cluster_job"]["state"] == "COMPLETED" and not in_queue(job_id)
            assert any(f"Slurm job {job_id}" in m for m in messages), messages
            assert result["next_step"].startswith(f"Slurm job {job_id} ended COMPLETED on {slurm}; ")

            started = await client.call_tool("run_verification", {**run, "steps": 300, "background": True})
            assert not started.is_error, text_of(started)
            job = started.structured_content["job_id"]
            for _ in range(600):  # until the batch job is running
                status = await client.call_tool("get_verification_status", {"job_id": job})
                if "RUNNING" in ((status.structured_content.get("progress") or {}).get("message") or ""):
                    break
                await anyio.sleep(0.2)
            cancelled = await client.call_tool("cancel_verification", {"job_id": job, "wait_s": 90})
        result = cancelled.structured_content
        assert result["state"] == "cancelled", result
        assert result["live_child_processes"] == []
        assert result["summary"]["verdict"] == "cancelled"
        report = json.loads((tmp_path / "runs").joinpath(result["out_dir"]).joinpath("report.json").read_text())
        assert report["cluster_job"]["state"] == "CANCELLED" and not in_queue(report["cluster_job"]["job_id"])
    finally:
        srv.jobs.shutdown(wait_s=60)
    assert_no_orphans(token)


def test_a_rank_crash_ends_the_job_failed_and_names_the_rank(slurm, tmp_path, monkeypatch):
    """The job ends by itself (a rank raises at step 1): Slurm's state and exit code are tracked and the
    report names the rank."""
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    res = _verify(*SMALL, "--steps", "3", "--inject-fault", "crash:1:overlap:1", "--out", str(out))
    assert res.returncode == 1, res.stderr[-3000:]
    report = assert_report_valid(out)
    assert report["verdict"] == "crashed" and report["failure"]["rank"] == 1, report["failure"]
    job = report["cluster_job"]
    assert job["state"] == "FAILED" and job["exit_code"] != "0:0", job
    assert f"Slurm job {job['job_id']}: FAILED" in res.stderr and not in_queue(job["job_id"])
    assert_no_orphans(token)


def test_a_hung_rank_scancels_the_job(slurm, tmp_path, monkeypatch):
    """A rank stops stepping (the others wait in their next collective): past --hang-timeout the job is
    scancelled; the report says hang and lists the silent ranks (their stacks are not readable from here)."""
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    res = _verify(*SMALL, "--steps", "4", "--hang-timeout", "5", "--inject-fault", "hang:1:overlap:2",
                  "--out", str(out))
    assert res.returncode == 1, res.stderr[-3000:]
    report = assert_report_valid(out)
    assert report["verdict"] == "hang" and "no heartbeat for 5 s" in report["failure"]["message"]
    assert report["cluster_job"]["state"] == "CANCELLED" and not in_queue(report["cluster_job"]["job_id"])
    assert_no_orphans(token)
