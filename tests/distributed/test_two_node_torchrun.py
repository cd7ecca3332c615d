"""Two torchrun agents on this host as two nodes, started with exactly the command `verify --print-launch
torchrun --nodes 2` prints (c10d rendezvous on 127.0.0.1, one CPU rank a node, one shared --out), then judged by
`verify --judge`; and the same with one node dying mid-run (its agent and its rank killed): the report names
that node's rank, and nothing is left running."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_overlap.mcp.jobs import descendant_pids
from tests.distributed._verify_util import assert_no_orphans, assert_report_valid, new_token

pytestmark = pytest.mark.slow
SMALL = ["--nproc", "2", "--nodes", "2", "--micro-batches", "2", "--modes", "baseline,overlap", "--no-explain"]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "moe_overlap.cli", "verify", *args], capture_output=True,
                          text=True, timeout=120)


def _printed(out: Path, steps: int) -> str:
    res = _cli(*SMALL, "--steps", str(steps), "--print-launch", "torchrun", "--out", str(out))
    assert res.returncode == 0, res.stderr
    line = res.stdout.strip()
    assert " --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint $MASTER_ADDR:$MASTER_PORT " in line
    return line


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _start_nodes(line: str, out: Path, tmp: Path) -> list[subprocess.Popen]:
    """Node 0's agent first (it hosts the rendezvous store), then node 1's; each runs the printed line in bash
    with the variables a user sets on every node (MASTER_ADDR, MASTER_PORT) and this Python's torchrun."""
    port = _free_port()
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
           "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    agents = []
    for node in (0, 1):
        log = open(tmp / f"node{node}.log", "wb")  # noqa: SIM115 - the agent holds it; closed with the test
        agents.append(subprocess.Popen(["bash", "-c", line], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True))
        deadline = time.monotonic() + 60
        while node == 0 and not _listening(port) and time.monotonic() < deadline:
            time.sleep(0.1)
    return agents


def _cleanup(agents: list[subprocess.Popen]) -> None:
    for a in agents:
        for pid in [*descendant_pids(a.pid), a.pid]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        a.wait(timeout=10)


def test_two_nodes_pass_and_are_judged(tmp_path, monkeypatch):
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    agents = _start_nodes(_printed(out, steps=2), out, tmp_path)
    try:
        codes = [a.wait(timeout=240) for a in agents]
    finally:
        _cleanup(agents)
    assert codes == [0, 0], [(tmp_path / f"node{n}.log").read_text()[-2000:] for n in (0, 1)]
    judged = _cli("--judge", str(out), "--format", "json")
    assert judged.returncode == 0, judged.stdout[-2000:] + judged.stderr
    assert json.loads(judged.stdout)["summary"]["verdict"] == "throughput-not-judged"  # cpu: all judged ones pass
    report = assert_report_valid(out)
    assert {r["mode"]: r["status"] for r in report["runs"]} == {"baseline": "completed", "overlap": "completed"}
    assert_no_orphans(token)


def _rank_of(pid: int) -> int | None:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    ranks = [int(e.split(b"=", 1)[1]) for e in env if e.startswith(b"RANK=")]
    return ranks[0] if ranks else None


@pytest.mark.parametrize("how", ["node", "agent"])
def test_a_node_dying_mid_run_is_named_and_nothing_is_left(tmp_path, monkeypatch, how):
    """node: node 1's agent and its rank SIGKILLed at once (a power loss); agent: only its torchrun agent
    stopped (SIGTERM, as a scheduler does), which stops its rank."""
    token = new_token(monkeypatch)
    out = tmp_path / "run"
    agents = _start_nodes(_printed(out, steps=30), out, tmp_path)
    try:
        deadline = time.monotonic() + 240
        rank0 = out / "ranks" / "rank0.jsonl"
        while time.monotonic() < deadline and not (rank0.exists() and '"kind": "step"' in rank0.read_text()
                                                   or rank0.exists() and '"kind":"step"' in rank0.read_text()):
            assert agents[0].poll() is None and agents[1].poll() is None, "an agent ended before the first step"
            time.sleep(0.2)
        # node 1 dies: its agent and everything under it, at once (as a power loss would)
        dying = [*descendant_pids(agents[1].pid), agents[1].pid]
        node1_ranks = sorted(r for r in map(_rank_of, dying) if r is not None)
        assert node1_ranks, "no rank process found under node 1's agent"
        for pid in dying if how == "node" else [agents[1].pid]:
            try:
                os.kill(pid, signal.SIGKILL if how == "node" else signal.SIGTERM)
            except ProcessLookupError:
                pass
        code0 = agents[0].wait(timeout=120)  # node 0's rank fails in its next collective; its agent ends
    finally:
        _cleanup(agents)
    assert code0 != 0
    judged = _cli("--judge", str(out), "--format", "json")
    assert judged.returncode == 1, judged.stdout[-2000:] + judged.stderr
    report = assert_report_valid(out)
    assert report["verdict"] == "crashed"
    assert report["failure"]["rank"] in node1_ranks, report["failure"]
    assert f"rank {report['failure']['rank']}" in report["failure"]["message"]
    assert_no_orphans(token)
