"""Helpers of the verification tests: the no-orphan process check (from /proc; psutil is not installed)
and schema validation of every report a test produces."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import jsonschema

from moe_overlap.skill.card.schemas import load_schema

TOKEN_ENV = "MOE_OVERLAP_VERIFY_TEST_TOKEN"


def new_token(monkeypatch) -> str:
    """A marker every child inherits through its environment (the launcher copies os.environ)."""
    token = uuid.uuid4().hex
    monkeypatch.setenv(TOKEN_ENV, token)
    return token


def _state(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def processes_with_token(token: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries `token`: any of them is an orphan."""
    needle = f"{TOKEN_ENV}={token}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env and _state(entry) not in (None, "Z"):
            found.append(int(entry))
    return found


def children_of(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return out


def assert_no_orphans(token: str, report=None) -> None:
    left = processes_with_token(token)
    assert not left, f"processes left behind: {left}"
    if report is not None:
        for pid in (report.criteria[1].evidence["launch"].get("pids") or []):
            assert _state(str(pid)) in (None, "Z"), f"rank process {pid} still alive"


def assert_report_valid(out: Path) -> dict:
    """report.json exists and is valid against the committed schema; report.md exists."""
    data = json.loads((Path(out) / "report.json").read_text(encoding="utf-8"))
    jsonschema.validate(data, load_schema("verification-report.schema.json"))
    assert (Path(out) / "report.md").is_file()
    return data


def interrupt_cli_run(cmd: list[str], presses: int = 1, timeout: float = 60) -> int:
    """Start `cmd` (a `moe-overlap verify` run), press Ctrl-C `presses` times once a step is printed (the ranks
    are up and training), and return its exit status."""
    import signal
    import subprocess
    import time

    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        for line in proc.stderr:
            if " step " in line:
                break
        for i in range(presses):
            if i:
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode
