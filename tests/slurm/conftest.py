"""A real one-host Slurm for the launcher tests: tests/slurm/setup_slurm.sh installs it from the
distribution's packages when missing and starts munged, slurmctld and slurmd. Where it cannot, the tests are
skipped with the script's reason; with MOE_OVERLAP_SLURM_REQUIRED=1 (CI, .ci/run) that is a failure instead.
Outside CI the script is called with MOE_OVERLAP_SLURM_NO_INSTALL=1: it starts an installed Slurm, and a
machine without one skips (run `sudo bash tests/slurm/setup_slurm.sh` once to install it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

SETUP = Path(__file__).with_name("setup_slurm.sh")
REQUIRED = os.environ.get("MOE_OVERLAP_SLURM_REQUIRED") == "1"


@pytest.fixture(scope="session")
def slurm() -> str:
    """This host's name as Slurm knows it, once Slurm is up."""
    why = None
    if shutil.which("bash") is None:
        why = "no bash to run tests/slurm/setup_slurm.sh"
    else:
        try:
            # Outside CI the tests start an installed Slurm but never install system packages themselves.
            env = {**os.environ, **({} if REQUIRED else {"MOE_OVERLAP_SLURM_NO_INSTALL": "1"})}
            res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600, env=env)
            if res.returncode != 0:
                why = (res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            why = "tests/slurm/setup_slurm.sh did not finish in 600 s"
    if why is not None:
        if REQUIRED:
            pytest.fail(f"Slurm is required here (MOE_OVERLAP_SLURM_REQUIRED=1) but could not be set up: {why}")
        pytest.skip(f"no Slurm: {why}")
    return socket.gethostname().split(".")[0]  # the NodeName setup_slurm.sh wrote (hostname -s)


def in_queue(job_id: str) -> bool:
    res = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%i"], capture_output=True, text=True)
    return str(job_id) in res.stdout.split()
