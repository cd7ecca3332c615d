"""One Slurm batch job, from this process: sbatch it, ask its state, scancel it (torch-free).

Only Slurm's own commands, with fixed arguments (the script is a file we wrote): ``sbatch --parsable``,
``squeue`` while the job is known there, ``scontrol show job`` for its end (state, exit code, nodes; kept by
slurmctld for MinJobAge, 300 s by default), ``sacct`` where an accounting database is there, ``scancel``.
A command that is missing or hangs raises SlurmError with what to do, never a traceback.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CMD_TIMEOUT_S = 30.0
# Slurm job states that are over (squeue/scontrol long names); everything else is pending or running.
ENDED = {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
         "TIMEOUT", "SPECIAL_EXIT", "REVOKED"}


class SlurmError(Exception):
    def __init__(self, message: str, fix: str = "check that the Slurm client commands work here (sinfo)"):
        super().__init__(message)
        self.message, self.fix = message, fix


@dataclass
class JobState:
    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, ... or UNKNOWN
    reason: str | None = None
    nodes: list[str] | None = None
    exit_code: str | None = None  # "code:signal" as Slurm writes it

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    def to_dict(self) -> dict:
        return asdict(self)


def require_client() -> None:
    """The Slurm commands this module runs are on PATH (else SlurmError saying what to do)."""
    for cmd in ("sbatch", "squeue", "scontrol", "scancel"):
        if shutil.which(cmd) is None:
            raise SlurmError(f"`{cmd}` is not on PATH: --launcher slurm needs the Slurm client commands",
                             fix="run on a Slurm login node, or use --print-launch slurm and submit the script "
                                 "elsewhere")


def _run(args: list[str], *, check: bool = True) -> subprocess.CompletedProcess:
    if shutil.which(args[0]) is None:
        raise SlurmError(f"`{args[0]}` is not on PATH: --launcher slurm needs the Slurm client commands",
                         fix="run on a Slurm login node, or use --print-launch slurm and submit the script elsewhere")
    try:
        res = subprocess.run(args, capture_output=True, text=True, timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{' '.join(args[:2])}` did not answer in {CMD_TIMEOUT_S:g} s (slurmctld down?)") from None
    if check and res.returncode != 0:
        raise SlurmError(f"`{' '.join(args[:2])}` failed (exit {res.returncode}): {res.stderr.strip()[:500]}")
    return res


# Every job this process submitted and has not seen end: what cancel_every_job() scancels when the process
# itself must stop now (the MCP server on SIGTERM or when its client is gone; mcp/jobs.py).
_LIVE: set[str] = set()


def submit(script: Path) -> str:
    """sbatch the script from its own folder; returns the job id."""
    res = _run(["sbatch", "--parsable", str(script)])
    job_id = res.stdout.strip().split(";")[0]  # --parsable: "id" or "id;cluster"
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SlurmError(f"sbatch printed no job id: {res.stdout.strip()[:200]!r}")
    _LIVE.add(job_id)
    return job_id


def forget(job_id: str) -> None:
    _LIVE.discard(job_id)


def cancel_every_job() -> None:
    """scancel every job this process submitted that is not known to have ended (does not wait)."""
    ids = sorted(_LIVE)
    if ids and shutil.which("scancel"):
        try:
            subprocess.run(["scancel", *ids], capture_output=True, timeout=CMD_TIMEOUT_S, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired):
            pass


def _hostnames(nodelist: str) -> list[str] | None:
    if not nodelist or nodelist in ("(null)", "None assigned"):
        return None
    res = _run(["scontrol", "show", "hostnames", nodelist], check=False)
    return res.stdout.split() if res.returncode == 0 and res.stdout.strip() else [nodelist]


def _scontrol(job_id: str) -> JobState | None:
    res = _run(["scontrol", "-o", "show", "job", job_id], check=False)
    if res.returncode != 0 or "JobState=" not in res.stdout:
        return None
    fields = dict(re.findall(r"(\w+)=(\S*)", res.stdout))
    return JobState(job_id=job_id, state=fields.get("JobState", "UNKNOWN"), reason=fields.get("Reason"),
                    nodes=_hostnames(fields.get("NodeList", "")), exit_code=fields.get("ExitCode"))


def _sacct(job_id: str) -> JobState | None:
    res = _run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList"], check=False)
    line = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    if "|" not in line:
        return None  # no accounting database (sacct: "Slurm accounting storage is disabled")
    state, code, nodelist = (line.split("|") + ["", ""])[:3]
    return JobState(job_id=job_id, state=state.split()[0], exit_code=code or None, nodes=_hostnames(nodelist))


def job_state(job_id: str) -> JobState:
    """The job as slurmctld knows it now (scontrol), else as accounting remembers it (sacct)."""
    return _scontrol(job_id) or _sacct(job_id) or JobState(job_id=job_id, state="UNKNOWN")


def in_queue(job_id: str) -> bool:
    """squeue still lists the job (True too when squeue does not answer: it may be there)."""
    try:
        res = _run(["squeue", "-h", "-j", job_id, "-o", "%i"], check=False)
    except SlurmError:
        return True
    return res.returncode == 0 and job_id in res.stdout.split()


def cancel(job_id: str, *, wait_s: float = 60.0) -> JobState:
    """scancel the job and wait until squeue no longer lists it (every step's processes are then gone)."""
    _run(["scancel", job_id], check=False)
    deadline = time.monotonic() + wait_s
    while in_queue(job_id) and time.monotonic() < deadline:
        time.sleep(0.5)
    if in_queue(job_id):
        _run(["scancel", "--signal=KILL", "--full", job_id], check=False)
        while in_queue(job_id) and time.monotonic() < deadline + 30:
            time.sleep(0.5)
    return job_state(job_id)
