"""`moe-overlap-mcp`: the MCP server (wiring only; the logic lives in skill/ and verify/).

    moe-overlap-mcp                                   # stdio (what desktop and CLI clients launch)
    moe-overlap-mcp --transport streamable-http --port 8765          # http://127.0.0.1:8765/mcp
    moe-overlap-mcp --allowed-dir ~/runs --allowed-dir ~/configs     # folders tools may read files from

Serves the skill files as resources (skill://...), the docs and JSON schemas, the tools listed in
docs/mcp.md, the `enable-ep-overlap` prompt, and the skills extension (skills/list, skills/get).
Start-up imports no torch and prints nothing on stdout: in stdio mode stdout carries only JSON-RPC.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resources import FileResource
from mcp.server.transport_security import TransportSecuritySettings

from moe_overlap import __version__
from moe_overlap.mcp import prompts, resources, tools_skill, tools_verify
from moe_overlap.mcp.jobs import JobManager
from moe_overlap.mcp.safety import AllowedRoots
from moe_overlap.mcp.skills_ext import SkillsExtension
from moe_overlap.mcp.toolkit import ArgumentGuard

NAME = "moe-overlap"
SKILL = "perf-expert-parallel-overlap"
INSTRUCTIONS = f"""Tools and knowledge for MoE expert-parallel (EP) communication overlap in Megatron \
training (overlap_moe_expert_parallel_comm, delay_wgrad_compute, flex dispatcher).
Start with skill://{SKILL}/SKILL.md (or the prompt `enable-ep-overlap`). Typical flow: validate_config -> \
generate_config when needed -> run_verification (background=true for long runs, then \
get_verification_status) -> check_training_log on the real job's log. diagnose_failure explains an error; \
estimate_overlap_benefit predicts the gain. File paths must lie inside the server's allowed folders."""
LOOPBACK_NAMES = ("localhost",)
SHUTDOWN_WAIT_S = 1.0  # SIGTERM or the client gone: the server is gone within 2 s, its ranks at once


@dataclass
class ServerOptions:
    allowed_dirs: list[str] | None = None  # None: the current folder (see AllowedRoots.default)
    runs_dir: str | None = None  # verification output folders; default: a fresh temp folder
    max_running_jobs: int = 1
    log_level: str = "WARNING"


def build_server(options: ServerOptions | None = None) -> MCPServer:
    """The configured server (no transport started): used by main() and by in-process tests."""
    options = options or ServerOptions()
    roots = AllowedRoots.from_paths(options.allowed_dirs) if options.allowed_dirs else AllowedRoots.default()
    runs_dir = Path(options.runs_dir) if options.runs_dir else None  # None: a temp folder on first use
    jobs = JobManager(max_running=options.max_running_jobs)

    @asynccontextmanager
    async def lifespan(_server: MCPServer) -> AsyncIterator[dict]:
        from moe_overlap.mcp import isolated

        isolated.prewarm()  # diagnose / check_training_log answer their first call without a process start
        try:
            yield {}
        finally:
            # The client went away (stdin closed, session ended): no verification may outlive it. The ranks are
            # killed at once; the job threads get a moment to write their reports, not more.
            from moe_overlap.mcp import isolated

            isolated.shutdown()
            jobs.shutdown(wait_s=SHUTDOWN_WAIT_S)

    guard = ArgumentGuard()
    skills = resources.skill_folders()
    instructions = INSTRUCTIONS + f"\nAllowed folders: {roots.describe()} (relative paths start in the first)."
    tools = tools_skill.tools(guard, roots) + tools_verify.tools(guard, roots, jobs, runs_dir)
    server = MCPServer(NAME, title="MoE EP-overlap skill", version=__version__, instructions=instructions,
                       lifespan=lifespan, middleware=[guard], tools=tools,
                       extensions=[SkillsExtension(skills)], log_level=options.log_level)  # type: ignore[arg-type]
    for entry in resources.registry():
        server.add_resource(FileResource(uri=entry.uri, name=entry.name, description=entry.description,
                                         mime_type=entry.mime_type, path=entry.path,
                                         encoding="utf-8" if resources.is_text(entry.mime_type) else None))
    tools_verify.register_resources(server, jobs)
    prompts.register(server, guard)
    server.jobs = jobs  # type: ignore[attr-defined]  # tests and main() reach the job manager here
    return server


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def transport_security(host: str, port: int, extra_hosts: list[str]) -> TransportSecuritySettings:
    """DNS-rebinding protection always on: only these Host / Origin headers are served."""
    hosts = ["127.0.0.1:*", "localhost:*", "[::1]:*"]
    origins = ["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"]
    for h in ([] if is_loopback(host) else [host]) + extra_hosts:
        hosts.append(f"{h}:*")
        origins += [f"http://{h}:*", f"https://{h}:*"]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True, allowed_hosts=hosts,
                                     allowed_origins=origins)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="moe-overlap-mcp", description=__doc__.split("\n")[0])
    ap.add_argument("--version", action="version", version=f"moe-overlap-mcp {__version__}")
    ap.add_argument("--transport", choices=["stdio", "streamable-http"], default="stdio")
    ap.add_argument("--host", default="127.0.0.1", help="HTTP bind address (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=8765, help="HTTP port (default 8765)")
    ap.add_argument("--allow-remote", action="store_true",
                    help="allow binding a non-loopback address (the server has no authentication)")
    ap.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                    help="extra Host header name accepted over HTTP (DNS-rebinding protection)")
    ap.add_argument("--allowed-dir", action="append", default=None, metavar="DIR",
                    help="folder tools may read config and log files from (repeatable; default: the current "
                         "folder, unless it is / or your home folder)")
    ap.add_argument("--runs-dir", default=None, help="where verification runs write (default: a temp folder)")
    ap.add_argument("--max-jobs", type=int, default=1, choices=range(0, 9), metavar="N",
                    help="verifications run at once (0-8, default 1; 0: run_verification only checks its input)")
    ap.add_argument("--log-level", default="WARNING", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                    help="server log level (logs go to stderr)")
    return ap


def _stop_on_signals(jobs: JobManager) -> None:
    """SIGTERM / SIGINT / SIGHUP (what clients send on shutdown): kill the verifications' ranks, then exit at once.

    Why not unwind normally: a tool may be running in a worker thread and the transport may be blocked reading
    its input; the server must be gone within a couple of seconds whatever it was doing, and no rank may stay.
    Over HTTP, uvicorn's own handlers (a graceful shutdown that waits for open streams) are not installed.
    """
    def handler(signum, frame):
        from moe_overlap.mcp import isolated

        isolated.shutdown()  # the worker processes of diagnose / check_training_log
        jobs.shutdown(wait_s=SHUTDOWN_WAIT_S)
        _exit_now(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def _exit_now(code: int) -> None:
    """Leave without waiting for worker threads (a tool call still running, a blocked read)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _serve_http(server: MCPServer, host: str, port: int, security: TransportSecuritySettings, log_level: str) -> None:
    import anyio
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self):  # keep the server's own handlers (_stop_on_signals)
            yield

    from moe_overlap.mcp.http_ints import LongIntGuard

    app = LongIntGuard(server.streamable_http_app(transport_security=security, host=host))
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), timeout_graceful_shutdown=1)
    anyio.run(_Server(config).serve)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.transport == "streamable-http" and not is_loopback(args.host) and not args.allow_remote:
        print(f"moe-overlap-mcp: refusing to bind {args.host}: not a loopback address. The server has no "
              "authentication; pass --allow-remote to bind it anyway.", file=sys.stderr)
        return 2
    try:
        server = build_server(ServerOptions(allowed_dirs=args.allowed_dir, runs_dir=args.runs_dir,
                                            max_running_jobs=args.max_jobs, log_level=args.log_level))
    except (ValueError, FileNotFoundError) as exc:
        print(f"moe-overlap-mcp: {exc}", file=sys.stderr)
        return 2
    jobs: JobManager = server.jobs  # type: ignore[attr-defined]
    _stop_on_signals(jobs)
    code = 0
    try:
        if args.transport == "stdio":
            import anyio

            from moe_overlap.mcp.stdio import serve_stdio

            # The client closed stdin: its verifications stop now (ranks killed), before requests are wound down.
            anyio.run(serve_stdio, server, lambda: jobs.shutdown(wait_s=0))
        else:
            if not is_loopback(args.host):
                print(f"moe-overlap-mcp: WARNING: serving on {args.host}:{args.port} without authentication; "
                      "anyone who can reach it can run verifications and read files under the allowed folders.",
                      file=sys.stderr)
            _serve_http(server, args.host, args.port, transport_security(args.host, args.port, args.allowed_host),
                        args.log_level)
    except Exception:  # noqa: BLE001 - logged; the ranks must still go
        logging.getLogger(__name__).exception("the server stopped on an error")
        code = 1
    finally:
        from moe_overlap.mcp import isolated

        isolated.shutdown()
        jobs.shutdown(wait_s=SHUTDOWN_WAIT_S)
    _exit_now(code)
    return code  # not reached


if __name__ == "__main__":
    sys.exit(main())
