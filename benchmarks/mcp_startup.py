#!/usr/bin/env python3
"""MCP server start-up: time from launching `moe-overlap-mcp` (stdio) to its answers to `initialize` and `tools/list`.

    python benchmarks/mcp_startup.py [--repeats 15] [--out benchmarks/results/mcp_startup.json]

What a client waits for when it starts the server. Each repeat launches a fresh
`python -m moe_overlap.server`, sends `initialize` at once and stops the clock when the response line
arrives on stdout, then sends `tools/list` (what clients ask next) and stops a second clock (both from
the launch). Two references, launched the same way and interleaved with the server so machine
noise hits all alike: `python -c pass` (interpreter start) and `python -c "import mcp.server.mcpserver"`
(the MCP SDK import every Python MCP server pays). The machine is shared: the load average before and
after is recorded; read the minimum as the unloaded cost and the median as the typical one.
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

ROOT = Path(__file__).resolve().parents[1]
INIT = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "mcp-startup-benchmark", "version": "0"}}}


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def time_server() -> tuple[float, float]:
    """Seconds from spawn to the initialize response, and to the first tools/list response."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server"], cwd=ROOT, env=_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdin.write((json.dumps(INIT) + "\n").encode())
    proc.stdin.flush()
    line = proc.stdout.readline()
    t_init = time.perf_counter() - t0
    reply = json.loads(line)
    if reply.get("id") != 1 or "result" not in reply:
        raise RuntimeError(f"unexpected first line: {line[:200]!r}")
    for message in ({"jsonrpc": "2.0", "method": "notifications/initialized"},
                    {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}):
        proc.stdin.write((json.dumps(message) + "\n").encode())
    proc.stdin.flush()
    tools = json.loads(proc.stdout.readline())
    t_tools = time.perf_counter() - t0
    if tools.get("id") != 2 or len(tools["result"]["tools"]) != 10:
        raise RuntimeError(f"unexpected tools/list answer: {str(tools)[:200]}")
    proc.stdin.close()  # the client goes away: the server exits
    proc.wait(30)
    return t_init, t_tools


def time_command(code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=_env(), check=True)
    return time.perf_counter() - t0


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

    rows = {"interpreter (python -c pass)": [], "MCP SDK import": [], "moe-overlap-mcp initialize": [],
            "moe-overlap-mcp first tools/list": []}
    load_before = os.getloadavg()
    time_server()  # warm the page cache and __pycache__ once, untimed
    for _ in range(args.repeats):
        rows["interpreter (python -c pass)"].append(time_command("pass"))
        rows["MCP SDK import"].append(time_command("import mcp.server.mcpserver"))
        t_init, t_tools = time_server()
        rows["moe-overlap-mcp initialize"].append(t_init)
        rows["moe-overlap-mcp first tools/list"].append(t_tools)
    load_after = os.getloadavg()

    table = []
    print(f"{'what':34} {'min s':>7} {'median s':>9} {'max s':>7}")
    for name, samples in rows.items():
        row = {"what": name, "min_s": round(min(samples), 3), "median_s": round(statistics.median(samples), 3),
               "max_s": round(max(samples), 3), "samples_s": [round(s, 3) for s in samples]}
        table.append(row)
        print(f"{name:34} {row['min_s']:7.3f} {row['median_s']:9.3f} {row['max_s']:7.3f}")
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} on {os.cpu_count()} CPUs")

    result = {
        "benchmark": "mcp_startup",
        "command": "python benchmarks/mcp_startup.py " + " ".join(sys.argv[1:]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": _commit(),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "load_average_before": [round(x, 2) for x in load_before],
                    "load_average_after": [round(x, 2) for x in load_after]},
        "versions": _versions(),
        "repeats": args.repeats,
        "rows": table,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
