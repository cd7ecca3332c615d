#!/usr/bin/env python3
"""Fuzz the MCP server over its real stdio wire: every request must get an answer to its own id, none an internal
error, none slower than 10 s (issue 34).

    python benchmarks/fuzz/fuzz_mcp_wire.py [--calls 6000] [--seed 0] [--out benchmarks/results/fuzz_mcp_wire.json]

Unlike fuzz_mcp.py (an in-process client, which always sends well-formed JSON), the lines here are written by
hand: tools/call requests whose arguments hold what Python data cannot (an integer of 5000 digits, NaN,
Infinity, 1e309, 1e-320, 3000-deep nesting) beside typed values at and beyond the schemas' limits, hostile
texts and paths (benchmarks/fuzz/fuzz_mcp.py's allowed folder: a FIFO, a link out, a folder), integer and
string ids. The server runs with --max-jobs 0 (run_verification checks its input, launches nothing); its peak
RSS (VmHWM) and its worker processes' are read from /proc.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import queue
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.fuzz import folder_cases as fc  # noqa: E402
from benchmarks.fuzz.fuzz_mcp import INTERNAL, PATHS, make_allowed_folder  # noqa: E402

LIMIT_S = 10.0
RAW = ("9" * 5000, "-" + "1" * 4400, "NaN", "Infinity", "-Infinity", "1e309", "1e-320", "5e-324", "[" * 3000 +
       "]" * 3000, '{"a":' * 500 + "1" + "}" * 500, "18446744073709551616", "-0", "1e308")
PLAIN = (None, True, False, 0, -1, 1, 2, 8, 64, 4096, 2**31, 2**63, 0.5, 1.0, 1e-9, "", "x", "auto", "cpu", "none",
         "1f1b", "h100", "qwen3-30b-a3b", "bf16", [], {}, ["baseline"], {"a": 1}, "🙂" * 100, "a" * 70000)


class Wire:
    def __init__(self, folder: Path, runs: Path):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "moe_overlap.server", "--allowed-dir", str(folder),
                                      "--runs-dir", str(runs), "--max-jobs", "0"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        self.answers: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.answers.put(json.loads(line))
            except ValueError:
                self.answers.put({"_not_json": line[:200].decode(errors="replace")})

    def send(self, line: str) -> None:
        self.proc.stdin.write(line.encode("utf-8", "replace") + b"\n")
        self.proc.stdin.flush()

    def answer(self, request_id, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                msg = self.answers.get(timeout=left)
            except queue.Empty:
                return None
            if "method" in msg:
                continue  # a notification from the server (progress, log)
            if msg.get("id") == request_id or "_not_json" in msg:
                return msg
            # an answer to another id: counted by the caller as a stray answer
            return {"_stray": msg}


def _value(rng: random.Random, prop: dict) -> str:
    r = rng.random()
    if r < 0.25:
        return rng.choice(RAW)
    if r < 0.45 and "enum" in prop:
        return json.dumps(rng.choice(prop["enum"]))
    if r < 0.55:
        return json.dumps(rng.choice(PATHS))
    if r < 0.65:
        return json.dumps(fc.diagnose_text(rng)[: rng.choice((100, 5000, 65536))])
    return json.dumps(rng.choice(PLAIN))


def request_line(rng: random.Random, tools: dict, request_id) -> str:
    name = rng.choice(sorted(tools))
    props = tools[name].get("properties", {})
    keys = rng.sample(sorted(props), k=rng.randint(0, len(props))) if props else []
    if rng.random() < 0.1:
        keys.append(rng.choice(("backgroud", "x", "", "__proto__")))
    args = ",".join(f"{json.dumps(k)}:{_value(rng, props.get(k, {}))}" for k in keys)
    return (f'{{"jsonrpc":"2.0","id":{json.dumps(request_id)},"method":"tools/call",'
            f'"params":{{"name":{json.dumps(name)},"arguments":{{{args}}}}}}}')


def run_wire(calls: int, seed: int) -> dict:
    """`calls` hand-written tools/call lines to a fresh stdio server; the tally (examples: the first problems)."""
    folder, runs = make_allowed_folder(), Path(tempfile.mkdtemp(prefix="fuzz-wire-runs-"))
    wire = Wire(folder, runs)
    wire.send(json.dumps({"jsonrpc": "2.0", "id": "init", "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}}))
    assert wire.answer("init", 60) is not None, "the server did not start"
    wire.send('{"jsonrpc":"2.0","method":"notifications/initialized"}')
    wire.send('{"jsonrpc":"2.0","id":"list","method":"tools/list"}')
    tools = {t["name"]: t["inputSchema"] for t in wire.answer("list", 30)["result"]["tools"]}
    rng = random.Random(seed)
    tally = {"calls": 0, "answered_own_id": 0, "unanswered": 0, "stray_answers": 0, "not_json": 0,
             "internal_errors": 0, "over_limit": 0, "slowest_s": 0.0, "kinds": {}, "examples": []}
    t_start = time.perf_counter()
    for i in range(calls):
        request_id = i if rng.random() < 0.8 else f"req-{i}"
        line = request_line(rng, tools, request_id)
        t0 = time.perf_counter()
        wire.send(line)
        msg = wire.answer(request_id, LIMIT_S * 3)
        took = time.perf_counter() - t0
        tally["calls"] += 1
        tally["slowest_s"] = max(tally["slowest_s"], round(took, 3))
        problem = None
        if msg is None:
            tally["unanswered"] += 1
            problem = "no answer"
        elif "_stray" in msg:
            tally["stray_answers"] += 1
            problem = f"answer to another id: {str(msg)[:200]}"
        elif "_not_json" in msg:
            tally["not_json"] += 1
            problem = f"not JSON on stdout: {msg['_not_json']}"
        else:
            tally["answered_own_id"] += 1
            kind = (f"error {msg['error']['code']}" if "error" in msg
                    else "isError" if msg["result"].get("isError") else "ok")
            tally["kinds"][kind] = tally["kinds"].get(kind, 0) + 1
            text = json.dumps(msg.get("error") or [c.get("text", "") for c in msg["result"].get("content", [])])
            hit = INTERNAL.search(text)
            # an error result reading like a crash, and not an echo of the input
            if kind == "error -32603" or (kind != "ok" and hit and hit.group(0) not in line):
                tally["internal_errors"] += 1
                problem = f"internal: {text[:300]}"
        if took > LIMIT_S:
            tally["over_limit"] += 1
            problem = problem or f"{took:.1f} s"
        if problem and len(tally["examples"]) < 10:
            tally["examples"].append(f"{problem}\n  {line[:300]}")
        if msg is None and wire.proc.poll() is not None:
            tally["examples"].append("the server exited")
            break
    tally["wall_s"] = round(time.perf_counter() - t_start, 1)
    tally["server_peak_rss_mb"] = _hwm(wire.proc.pid)
    tally["worker_peak_rss_mb"] = max([_hwm(int(p)) for p in _children(wire.proc.pid)] or [0.0])
    wire.proc.stdin.close()
    try:
        wire.proc.wait(30)
    finally:
        if wire.proc.poll() is None:
            wire.proc.kill()
    shutil.rmtree(folder, ignore_errors=True)
    shutil.rmtree(runs, ignore_errors=True)
    return tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    tally = run_wire(args.calls, args.seed)
    print(json.dumps({k: v for k, v in tally.items() if k != "examples"}, indent=1))
    for ex in tally["examples"]:
        print(ex)
    if args.out:
        record = {"command": "python benchmarks/fuzz/fuzz_mcp_wire.py " + " ".join(sys.argv[1:]),
                  "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                  "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                              "load_average": list(os.getloadavg())},
                  "python": platform.python_version(), "limit_s": LIMIT_S, "seed": args.seed, **tally}
        args.out.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    bad = tally["unanswered"] + tally["stray_answers"] + tally["not_json"] + tally["internal_errors"]
    return 1 if bad or tally["over_limit"] else 0


def _hwm(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    m = re.search(r"VmHWM:\s+(\d+) kB", text)
    return round(int(m.group(1)) / 1024, 1) if m else 0.0


def _children(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []


if __name__ == "__main__":
    sys.exit(main())
