#!/usr/bin/env python3
"""MCP server start-up: time from launching `moe-overlap-mcp` (stdio) to its answers to `initialize` and `tools/list`.

    python benchmarks/cpu/mcp_startup.py [--repeats 15] [--out benchmarks/results/mcp_startup.json]

What a client waits for when it starts the server. Each repeat launches a fresh
`python -m moe_overlap.server`, sends `initialize` at once and stops the clock when the response line
arrives on stdout, then sends `tools/list` (what clients ask next) and stops a second clock (both from
the launch). Two references, launched the same way and interleaved with the server so machine
noise hits all alike: `python -c pass` (interpreter start) and `python -c "import mcp.server.mcpserver"`
(the MCP SDK import every Python MCP server pays).

Wall time depends on what else runs: the CPU time (user + system) of the process up to the answer is
recorded too. Start-up is one thread, so on an idle machine its wall time is about its CPU time; on a
shared one (load average recorded before and after) the CPU time is the figure to compare.

The SDK reference row also pays the interpreter's exit (freeing the imported modules), which the server
rows do not: so the server's own share is read from a third reference, a fresh process that times its
phases in process (SDK import, our server modules, `build_server()`), not from the difference of rows.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "mcp-startup-benchmark", "version": "0"}}}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds a live process has used so far (/proc, clock-tick resolution)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def time_server() -> dict[str, float]:
    """Wall and CPU seconds from spawn to the initialize response, and to the first tools/list response."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server"], cwd=ROOT, env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write((json.dumps(INIT) + "\n").encode())
    proc.stdin.flush()
    line = proc.stdout.readline()
    t_init, cpu_init = time.perf_counter() - t0, _cpu_s(proc.pid)
    reply = json.loads(line)
    if reply.get("id") != 1 or "result" not in reply:
        raise RuntimeError(f"unexpected first line: {line[:200]!r}")
    for message in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
        proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()
    tools = json.loads(proc.stdout.readline())
    t_tools, cpu_tools = time.perf_counter() - t0, _cpu_s(proc.pid)
    if tools.get("id") != 2 or len(tools["result"]["tools"]) != 10:
        raise RuntimeError(f"unexpected tools/list answer: {str(tools)[:200]}")
    proc.stdin.close()  # the client goes away: the server exits
    proc.wait(30)
    return {"init": t_init, "init_cpu": cpu_init, "tools": t_tools, "tools_cpu": cpu_tools}


def time_command(code: str) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of `python -c code`."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env())
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise RuntimeError(f"python -c {code!r} failed")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


PHASES = """
import json, time
t0 = time.perf_counter()
import mcp.server.mcpserver
t1 = time.perf_counter()
import moe_overlap.server as server
t2 = time.perf_counter()
server.build_server()
t3 = time.perf_counter()
print(json.dumps({"sdk_import": t1 - t0, "server_modules": t2 - t1, "build_server": t3 - t2}))
"""


def time_phases() -> dict[str, float]:
    """In-process seconds of the start-up phases, measured inside one fresh interpreter."""
    out = subprocess.run([sys.executable, "-c", PHASES], cwd=ROOT, env=_env(), capture_output=True, text=True,
                         check=True, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("mcp", "pydantic", "anyio", "starlette"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = "absent"
    return out


def _commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "mcp_startup.json"))
    args = ap.parse_args()

    names = ("interpreter (python -c pass)", "MCP SDK import", "moe-overlap-mcp initialize",
             "moe-overlap-mcp first tools/list")
    wall: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    phases: dict[str, list[float]] = {}
    load_before = os.getloadavg()
    time_server()  # warm the page cache and __pycache__ once, untimed
    for _ in range(args.repeats):
        for name, code in ((names[0], "pass"), (names[1], "import mcp.server.mcpserver")):
            w, c = time_command(code)
            wall[name].append(w)
            cpu[name].append(c)
        got = time_server()
        wall[names[2]].append(got["init"])
        cpu[names[2]].append(got["init_cpu"])
        wall[names[3]].append(got["tools"])
        cpu[names[3]].append(got["tools_cpu"])
        for k, v in time_phases().items():
            phases.setdefault(k, []).append(v)
    load_after = os.getloadavg()

    table = []
    print(f"{'what':34} {'wall min':>8} {'wall med':>8} {'wall max':>8} {'cpu med':>8}  (seconds)")
    for name in names:
        w, c = wall[name], cpu[name]
        row = {"what": name, "wall_min_s": round(min(w), 3), "wall_median_s": round(statistics.median(w), 3),
               "wall_max_s": round(max(w), 3), "cpu_median_s": round(statistics.median(c), 3),
               "cpu_min_s": round(min(c), 3), "wall_samples_s": [round(x, 3) for x in w],
               "cpu_samples_s": [round(x, 3) for x in c]}
        table.append(row)
        print(f"{name:34} {row['wall_min_s']:8.3f} {row['wall_median_s']:8.3f} {row['wall_max_s']:8.3f} "
              f"{row['cpu_median_s']:8.3f}")
    phase_rows = {k: {"median_s": round(statistics.median(v), 3), "min_s": round(min(v), 3),
                      "max_s": round(max(v), 3), "samples_s": [round(x, 3) for x in v]} for k, v in phases.items()}
    print("in-process phases (median, min-max s): " + ", ".join(
        f"{k} {r['median_s']:.3f} ({r['min_s']:.3f}-{r['max_s']:.3f})" for k, r in phase_rows.items()))
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs")

    result = {
        "benchmark": "mcp_startup",
        "command": "python benchmarks/cpu/mcp_startup.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in load_after]},
        "versions": _versions(),
        "repeats": args.repeats,
        "rows": table,
        "in_process_phases": phase_rows,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
