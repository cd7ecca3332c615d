"""check_training_log: the seed's log checks on a training log (torch-free).

After a run with EP overlap, the seed asks to confirm (1) no assertion error while CommOverlapConfig is
finalised, (2) ``overlap_moe_expert_parallel_comm`` logged as True, (3) with the flex dispatcher,
``moe_token_dispatcher_type`` = flex and the right backend, and no "Falling back to alltoall" warning from
Bridge's apply_flex_dispatcher_backend. We also look for tracebacks, NCCL/gloo errors and hang reports. Three layouts of the effective config are read:

  Megatron-LM argument dump   ``  overlap_moe_expert_parallel_comm ........ True`` (also our verify logs)
  Megatron-Bridge YAML dump   ``  overlap_moe_expert_parallel_comm: true``
  key=value / Namespace repr  ``overlap_moe_expert_parallel_comm=True``

When a key is logged more than once (a restart, several sections) the last value wins, as it does in the run.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field

KEYS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_token_dispatcher_type",
        "moe_flex_dispatcher_backend", "expert_model_parallel_size", "moe_enable_deepep")
_KEY_ALT = "|".join(KEYS)
_PATTERNS = (
    re.compile(rf"^\s*(?:[\w.\[\]]+\.)?({_KEY_ALT})\s+\.{{2,}}\s+(.+?)\s*$"),  # Megatron-LM dots
    re.compile(rf"^\s*(?:[\w.]+\.)?({_KEY_ALT})\s*:\s*(.+?)\s*$"),  # YAML
    re.compile(rf"\b({_KEY_ALT})\s*=\s*('[^']*'|\"[^\"]*\"|[^,\s)]+)"),  # key=value
)
# (kind, pattern): what makes a log not clean. Order matters only for reporting.
_ERRORS = (
    ("assertion", re.compile(r"\bAssertionError\b")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
    ("nccl", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|"
                        r"ncclInvalidUsage|NCCL communicator was aborted|DistBackendError")),
    ("hang", re.compile(r"Watchdog caught collective operation timeout|collective operation timeout|"
                        r"ProcessGroupNCCL.{0,80}[Tt]imeout|[Hh]eartbeat monitor timed out|appears to be hung|"
                        r"sent no heartbeat for|[Tt]imed out waiting for|gloo.{0,80}[Tt]imed out")),
    ("gloo", re.compile(r"Connection closed by peer|Gloo connectFullMesh failed|Connection reset by peer")),
    ("cuda", re.compile(r"CUDA error|CUDA out of memory|OutOfMemoryError|illegal memory access")),
)
# Megatron-Bridge's apply_flex_dispatcher_backend when it cannot apply the backend (megatron-bridge 0.6.2
# src/megatron/bridge/training/flex_dispatcher_backend.py:44-96): the run silently uses alltoall, or no flex at all.
_FLEX_FALLBACK = re.compile(r"Falling back to alltoall|Skipping flex dispatcher(?: backend)? configuration", re.I)
_OVERLAP_ASSERT = re.compile(r"comm_?overlap|CommOverlapConfig|overlap_moe_expert_parallel_comm|"
                             r"delay_wgrad_compute|expert_model_parallel_size|moe_token_dispatcher_type", re.I)


class LogCheck(BaseModel):
    id: str
    status: Literal["pass", "fail", "warn", "info"]
    message: str
    line: int | None = Field(None, description="1-based line of the evidence")
    evidence: str | None = None


class LogError(BaseModel):
    kind: Literal["assertion", "traceback", "nccl", "hang", "gloo", "cuda"]
    line: int
    text: str


class LogCheckResult(BaseModel):
    ok: bool = Field(description="every check passed (warnings allowed)")
    format: Literal["moe-overlap", "megatron-lm", "megatron-bridge", "unknown"]
    effective_config: dict[str, Any] = Field(description="last logged value of each overlap key")
    checks: list[LogCheck]
    errors: list[LogError] = Field(default_factory=list, description="first 20 error lines")
    lines: int


def _value(text: str) -> Any:
    t = text.strip().strip("'\"")
    low = t.lower()
    if low in ("true", "yes", "on"):
        return True
    if low in ("false", "no", "off"):
        return False
    if low in ("none", "null", "~", ""):
        return None
    if re.fullmatch(r"-?\d+", t):
        return int(t)
    return t


def _detect_format(text: str) -> str:
    if "[moe-overlap]" in text:
        return "moe-overlap"
    if "------------------------ arguments ------------------------" in text or re.search(r"\biteration\s+\d+/", text):
        return "megatron-lm"
    if re.search(r"^\s*comm_overlap\s*:", text, re.M) or "ConfigContainer" in text or "megatron.bridge" in text:
        return "megatron-bridge"
    return "unknown"


def _scan(lines: list[str]) -> tuple[dict[str, tuple[Any, int, str]], list[LogError]]:
    found: dict[str, tuple[Any, int, str]] = {}
    errors: list[LogError] = []
    for i, line in enumerate(lines, 1):
        for pat in _PATTERNS:
            hits = list(pat.finditer(line)) if pat is _PATTERNS[2] else [m for m in [pat.match(line)] if m]
            for m in hits:
                found[m.group(1)] = (_value(m.group(2)), i, line.strip()[:200])
            if hits:
                break
        for kind, pat in _ERRORS:
            if pat.search(line):
                errors.append(LogError(kind=kind, line=i, text=line.strip()[:300]))
                break
    return found, errors


def _flag_check(cid: str, key: str, found, expect: bool | None) -> LogCheck:
    if key not in found:
        status = "fail" if expect else "warn" if expect is not None else "info"
        return LogCheck(id=cid, status=status, message=f"{key} is not in the log: the effective config cannot be "
                        "confirmed (log the config at start-up: Megatron-LM prints its arguments, Bridge its YAML)")
    value, line, text = found[key]
    if expect is None:
        return LogCheck(id=cid, status="info", message=f"{key} = {value}", line=line, evidence=text)
    ok = value is expect
    return LogCheck(id=cid, status="pass" if ok else "fail", line=line, evidence=text,
                    message=f"{key} = {value}" + ("" if ok else f", expected {expect}"))


def _fallback_check(lines: list[str]) -> LogCheck:
    hits = [(i, line.strip()[:300]) for i, line in enumerate(lines, 1) if _FLEX_FALLBACK.search(line)]
    if not hits:
        return LogCheck(id="no-flex-fallback", status="pass",
                        message="no flex-dispatcher fallback warning (apply_flex_dispatcher_backend)")
    line, text = hits[0]
    return LogCheck(id="no-flex-fallback", status="fail", line=line, evidence=text, message=(
        "apply_flex_dispatcher_backend did not apply the flex backend (unsupported GPU, or not an MoE model): the run "
        "used the alltoall dispatcher, not DeepEP/HybridEP/NCCL EP; use a backend this GPU supports "
        "(flex-backend-gpu-support) or plan for alltoall"))


def check_training_log(text: str, *, expect_overlap: bool | None = True,
                       expect_delay_wgrad: bool | None = None) -> LogCheckResult:
    """Check a training log. `expect_overlap`/`expect_delay_wgrad`: the value each flag must have (None: report)."""
    lines = text.splitlines()
    found, errors = _scan(lines)
    checks = [_flag_check("overlap-flag-logged", "overlap_moe_expert_parallel_comm", found, expect_overlap),
              _flag_check("delay-wgrad-logged", "delay_wgrad_compute", found, expect_delay_wgrad)]
    dispatcher = found.get("moe_token_dispatcher_type")
    backend = found.get("moe_flex_dispatcher_backend")
    overlap_on = found.get("overlap_moe_expert_parallel_comm", (None,))[0] is True
    if dispatcher is None:
        checks.append(LogCheck(id="dispatcher-logged", status="warn" if overlap_on else "info",
                               message="moe_token_dispatcher_type is not in the log"))
    else:
        d_value, d_line, d_text = dispatcher
        status, msg = "pass", f"moe_token_dispatcher_type = {d_value}"
        if overlap_on and d_value not in ("alltoall", "flex"):
            status, msg = "fail", msg + ": EP overlap needs alltoall or flex"
        checks.append(LogCheck(id="dispatcher-logged", status=status, message=msg, line=d_line, evidence=d_text))
    if backend is not None and backend[0] is not None:
        is_flex = dispatcher is not None and dispatcher[0] == "flex"
        checks.append(LogCheck(
            id="flex-backend-active", status="pass" if is_flex else "fail", line=backend[1], evidence=backend[2],
            message=f"moe_flex_dispatcher_backend = {backend[0]}" + (" with the flex dispatcher" if is_flex else
                    ": set without moe_token_dispatcher_type=flex, so it has no effect "
                    "(use apply_flex_dispatcher_backend)")))
    elif dispatcher is not None and dispatcher[0] == "flex":
        checks.append(LogCheck(id="flex-backend-active", status="warn", line=dispatcher[1],
                               message="flex dispatcher without a logged moe_flex_dispatcher_backend"))
    checks.append(_fallback_check(lines))
    by_kind: dict[str, list[LogError]] = {}
    for e in errors:
        by_kind.setdefault(e.kind, []).append(e)
    overlap_asserts = [e for e in by_kind.get("assertion", []) if _OVERLAP_ASSERT.search(e.text)
                       or any(_OVERLAP_ASSERT.search(lines[j]) for j in range(max(0, e.line - 6), e.line))]
    for cid, kinds, what in (("no-overlap-config-assertion", None, "assertion error while finalising the overlap "
                              "config (CommOverlapConfig / TransformerConfig)"),
                             ("no-assertion-errors", ("assertion",), "AssertionError"),
                             ("no-tracebacks", ("traceback",), "Python traceback"),
                             ("no-nccl-errors", ("nccl", "gloo", "cuda"), "NCCL / gloo / CUDA error"),
                             ("no-hangs", ("hang",), "hang or collective timeout")):
        hits = overlap_asserts if kinds is None else [e for k in kinds for e in by_kind.get(k, [])]
        if hits:
            first = min(hits, key=lambda e: e.line)
            checks.append(LogCheck(id=cid, status="fail", line=first.line, evidence=first.text,
                                   message=f"{len(hits)} {what} line(s), first at line {first.line}"))
        else:
            checks.append(LogCheck(id=cid, status="pass", message=f"no {what}"))
    effective = {k: v[0] for k, v in found.items()}
    return LogCheckResult(ok=not any(c.status == "fail" for c in checks), format=_detect_format(text),
                          effective_config=effective, checks=checks, errors=errors[:20], lines=len(lines))
