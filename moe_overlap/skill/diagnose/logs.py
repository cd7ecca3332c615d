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

from moe_overlap.skill.diagnose.loglines import (
    KEY_LINE_CHARS,
    line_count,
    lines_before,
    lines_matching,
    log_value,
    strip_prefixes,
)

KEYS = ("overlap_moe_expert_parallel_comm", "delay_wgrad_compute", "moe_token_dispatcher_type",
        "moe_flex_dispatcher_backend", "expert_model_parallel_size", "moe_enable_deepep")
_KEY_ALT = "|".join(KEYS)
# Matched on at most KEY_LINE_CHARS characters of a prefix-free line (loglines.py). The value is taken whole and
# stripped in Python: a lazy `(.+?)\s*$` retries the end at every character, quadratic on a line of spaces.
_PATTERNS = (
    re.compile(rf"[ \t]*(?:[\w.\[\]]{{1,200}}\.)?({_KEY_ALT})[ \t]+\.{{2,}}[ \t]+(\S.*)"),  # Megatron-LM dots
    re.compile(rf"[ \t]*(?:[\w.]{{1,200}}\.)?({_KEY_ALT})[ \t]*:[ \t]*(\S.*)"),  # YAML
    re.compile(rf"\b({_KEY_ALT})[ \t]*=[ \t]*('[^'\n]{{0,200}}'|\"[^\"\n]{{0,200}}\"|[^,\s)]{{1,200}})"),  # key=value
)
_ANY_KEY = re.compile(_KEY_ALT)
# (kind, pattern): what makes a log not clean. Order matters only for reporting.
_ERRORS = (
    # DeepEP's own messages (raised as RuntimeError, or printed by its kernels' timeout checks) and Megatron-Core's
    # "DeepEP is not installed" / "HybridEP is not installed" (megatron-core 0.19.2 token_dispatcher.py:1275, :1049);
    # HybridEP's own asserts name its sources (csrc/hybrid_ep/...), its crashes its buffer (HybridEPBuffer::...).
    ("deepep", re.compile(r"DeepEP error|DeepEP timeout|DeepEP is not installed")),
    ("hybridep", re.compile(r"HybridEP is not installed|HybridEP (?:error|timeout)|hybrid_ep/[^\n]{0,300}Assertion|"
                            r"HybridEPBuffer::")),
    ("assertion", re.compile(r"\bAssertionError\b")),
    ("cuda", re.compile(r"CUDA error|CUDA out of memory|OutOfMemoryError|illegal memory access")),
    ("nccl", re.compile(r"NCCL error|ncclInternalError|ncclSystemError|ncclUnhandledCudaError|ncclRemoteError|"
                        r"ncclInvalidUsage|NCCL communicator was aborted|DistBackendError")),
    ("hang", re.compile(r"Watchdog caught collective operation timeout|collective operation timeout|"
                        r"ProcessGroupNCCL.{0,80}[Tt]imeout|[Hh]eartbeat monitor timed out|appears to be hung|"
                        r"sent no heartbeat for|[Tt]imed out waiting for|gloo.{0,80}[Tt]imed out")),
    ("gloo", re.compile(r"Connection closed by peer|Gloo connectFullMesh failed|Connection reset by peer")),
    # A Python exception line, with or without the "Traceback (most recent call last):" header above it (a log
    # excerpt, interleaved ranks, a launcher that keeps only the last lines). Named exceptions only: a bare
    # "error:" in a message is no exception.
    ("exception", re.compile(r"\b(?:Runtime|Value|Attribute|Type|Key|Index|Import|ModuleNotFound|NotImplemented|"
                             r"ZeroDivision|ChildFailed|DistNetwork|DistStore|Accelerator|Timeout)Error:")),
    # A native crash: a C/CUDA assert ("Assertion `x' failed."), a segfault report, a fatal Python error.
    ("crash", re.compile(r"Assertion [`'][^\n]{0,300}' failed|Segfault encountered|Segmentation fault|"
                         r"Fatal Python error")),
    ("traceback", re.compile(r"Traceback \(most recent call last\)")),
)
# A literal that every line of a kind holds: searched for first (at memchr speed; a pattern that starts with \b or
# an alternation is tried at every character), the kind's pattern then confirms each line it finds.
_TRIGGERS = {"assertion": re.compile("AssertionError"), "exception": re.compile("Error:")}
# Which error names the failure when several kinds occur: the most specific cause first (a DeepEP timeout is
# what the NCCL watchdog reports minutes later; a traceback header says nothing by itself).
_CAUSE_ORDER = ("deepep", "hybridep", "cuda", "assertion", "crash", "exception", "nccl", "hang", "gloo",
                "traceback")
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
    kind: Literal["deepep", "hybridep", "assertion", "cuda", "nccl", "hang", "gloo", "exception", "crash",
                  "traceback"]
    line: int
    text: str


class LogCheckResult(BaseModel):
    ok: bool = Field(description="every check passed (warnings allowed)")
    format: Literal["moe-overlap", "megatron-lm", "megatron-bridge", "unknown"]
    effective_config: dict[str, Any] = Field(description="last logged value of each overlap key")
    checks: list[LogCheck]
    errors: list[LogError] = Field(default_factory=list, description="first 20 error lines")
    failure: LogError | None = Field(None, description=(
        "the error line that names the failure: the first line of the most specific kind found (DeepEP, "
        "HybridEP, CUDA, assertion, native crash, other exception, NCCL, hang, gloo, bare traceback header)"))
    lines: int


def _value(text: str) -> Any:
    return log_value(text)


_ITERATION = re.compile(r"\biteration[ \t]{1,64}\d{1,12}/")
_BRIDGE_SECTION = re.compile(r"comm_overlap[ \t]*:")
MAX_ERRORS_KEPT = 20  # LogCheckResult.errors: the first ones; each check still counts them all


# A line of Megatron-LM's argument dump ("  moe_token_dispatcher_type ....... alltoall"): an excerpt often lacks
# the block's header. Anchored at a line start, every repeat bounded or followed by a fixed character: linear.
_ARG_LINE = re.compile(r"^[ \t]{1,4}[a-z][a-z0-9_]{0,80} \.{3,}[ \t]", re.MULTILINE)


def _detect_format(text: str) -> str:
    if "[moe-overlap]" in text:
        return "moe-overlap"
    if ("------------------------ arguments ------------------------" in text or _ITERATION.search(text)
            or _ARG_LINE.search(text)):
        return "megatron-lm"
    if any(strip_prefixes(line).lstrip(" \t").startswith("comm_overlap")
           for _, _, line in lines_matching(_BRIDGE_SECTION, text)) \
            or "ConfigContainer" in text or "megatron.bridge" in text:
        return "megatron-bridge"
    return "unknown"


class _Scan:
    """The last value of each key, and the error lines (counted all, kept first few).

    Only lines holding a key or an error pattern are looked at in Python (loglines.lines_matching); each with
    its launcher / logging prefixes taken off first, so a prefixed log reads like a plain one.
    """

    def __init__(self) -> None:
        self.found: dict[str, tuple[Any, int, str]] = {}
        self.errors: list[LogError] = []  # the first MAX_ERRORS_KEPT
        self.count: dict[str, int] = {}
        self.first: dict[str, LogError] = {}  # per kind
        self.overlap_asserts = 0
        self.first_overlap_assert: LogError | None = None

    def run(self, text: str) -> int:
        for n, _, raw in lines_matching(_ANY_KEY, text):
            head = strip_prefixes(raw[:KEY_LINE_CHARS])
            for pat in _PATTERNS:
                hits = list(pat.finditer(head)) if pat is _PATTERNS[2] else [m for m in [pat.match(head)] if m]
                for m in hits:
                    self.found[m.group(1)] = (_value(m.group(2)), n, raw.strip()[:200])
                if hits:
                    break
        # One pass per kind: a pattern searched alone runs at C speed (a literal one at memchr speed), while one
        # alternation of them all costs their sum many times over. A line may so count for two kinds
        # ("RuntimeError: DeepEP error: ..." is a DeepEP error and a Python exception); the kept list shows it once.
        kept: list[LogError] = []
        for kind, pat in _ERRORS:
            trigger = _TRIGGERS.get(kind)
            for n, start, raw in lines_matching(trigger or pat, text):
                if trigger is not None and not pat.search(raw):
                    continue
                err = self._error(kind, n, raw, text, start)
                if err is not None:
                    kept.append(err)
        seen: set[int] = set()
        for err in sorted(kept, key=lambda e: e.line):  # stable: on one line the kind listed first in _ERRORS wins
            if err.line not in seen and len(self.errors) < MAX_ERRORS_KEPT:
                seen.add(err.line)
                self.errors.append(err)
        return line_count(text)

    def _error(self, kind: str, n: int, raw: str, text: str, start: int) -> LogError | None:
        """Count one error line; return it when it is among the first MAX_ERRORS_KEPT of its kind."""
        count = self.count[kind] = self.count.get(kind, 0) + 1
        keep = count <= MAX_ERRORS_KEPT
        if not keep and kind != "assertion":
            return None
        err = LogError(kind=kind, line=n, text=raw.strip()[:300])
        self.first.setdefault(kind, err)
        if kind == "assertion" and (_OVERLAP_ASSERT.search(err.text) or any(
                _OVERLAP_ASSERT.search(x[:KEY_LINE_CHARS]) for x in lines_before(text, start, 6))):
            self.overlap_asserts += 1
            self.first_overlap_assert = self.first_overlap_assert or err
        return err if keep else None


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


def _fallback_check(log: str) -> LogCheck:
    hit = next(lines_matching(_FLEX_FALLBACK, log), None)  # the first line with the warning, found in one pass
    if hit is None:
        return LogCheck(id="no-flex-fallback", status="pass",
                        message="no flex-dispatcher fallback warning (apply_flex_dispatcher_backend)")
    line, text = hit[0], hit[2].strip()[:300]
    return LogCheck(id="no-flex-fallback", status="fail", line=line, evidence=text, message=(
        "apply_flex_dispatcher_backend did not apply the flex backend (unsupported GPU, or not an MoE model): the run "
        "used the alltoall dispatcher, not DeepEP/HybridEP/NCCL EP; use a backend this GPU supports "
        "(flex-backend-gpu-support) or plan for alltoall"))


def check_training_log(text: str, *, expect_overlap: bool | None = True,
                       expect_delay_wgrad: bool | None = None) -> LogCheckResult:
    """Check a training log. `expect_overlap`/`expect_delay_wgrad`: the value each flag must have (None: report)."""
    scan = _Scan()
    lines = scan.run(text)
    found = scan.found
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
    is_flex = dispatcher is not None and dispatcher[0] == "flex"
    if backend is not None and backend[0] is not None and is_flex:
        checks.append(LogCheck(id="flex-backend-active", status="pass", line=backend[1], evidence=backend[2],
                               message=f"moe_flex_dispatcher_backend = {backend[0]} with the flex dispatcher"))
    elif backend is not None and backend[0] is not None:
        # Megatron-LM prints every argument, so its default backend (deepep: transformer_config.py, megatron-core
        # 0.19.2 line 869) appears whatever the dispatcher; Bridge's YAML dump does the same. Only flex reads it.
        checks.append(LogCheck(id="flex-backend-active", status="info", line=backend[1], evidence=backend[2],
                               message=f"moe_flex_dispatcher_backend = {backend[0]} is not used: the dispatcher is "
                                       f"{dispatcher[0] if dispatcher else 'not logged'}, and only flex reads it"))
    elif is_flex:
        checks.append(LogCheck(id="flex-backend-active", status="warn", line=dispatcher[1],
                               message="flex dispatcher without a logged moe_flex_dispatcher_backend"))
    checks.append(_fallback_check(text))
    for cid, kinds, what in (("no-overlap-config-assertion", None, "assertion error while finalising the overlap "
                              "config (CommOverlapConfig / TransformerConfig)"),
                             ("no-assertion-errors", ("assertion",), "AssertionError"),
                             ("no-tracebacks", ("traceback",), "Python traceback"),
                             ("no-exceptions", ("exception", "crash"), "Python exception or native crash"),
                             ("no-dispatcher-errors", ("deepep", "hybridep"), "DeepEP / HybridEP error"),
                             ("no-nccl-errors", ("nccl", "gloo", "cuda"), "NCCL / gloo / CUDA error"),
                             ("no-hangs", ("hang",), "hang or collective timeout")):
        if kinds is None:
            count, firsts = scan.overlap_asserts, [scan.first_overlap_assert] if scan.first_overlap_assert else []
        else:
            count = sum(scan.count.get(k, 0) for k in kinds)
            firsts = [scan.first[k] for k in kinds if k in scan.first]
        if count:
            first = min(firsts, key=lambda e: e.line)
            checks.append(LogCheck(id=cid, status="fail", line=first.line, evidence=first.text,
                                   message=f"{count} {what} line(s), first at line {first.line}"))
        else:
            checks.append(LogCheck(id=cid, status="pass", message=f"no {what}"))
    effective = {k: v[0] for k, v in found.items()}
    failure = next((scan.first[k] for k in _CAUSE_ORDER if k in scan.first), None)
    return LogCheckResult(ok=not any(c.status == "fail" for c in checks), format=_detect_format(text),
                          effective_config=effective, checks=checks, errors=scan.errors, failure=failure, lines=lines)
