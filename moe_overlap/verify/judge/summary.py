"""The verification summary: what a person or an assistant reads first (torch-free).

One function for every surface: the CLI's text output renders it, the MCP tools return it beside the
(bounded) report. It holds the verdict and its headline, each criterion in one line, the per-mode split of the
step time with the estimator's prediction beside the measured ratio, and the explanation.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from moe_overlap.verify.judge.report_model import VerificationReport


class CriterionLine(BaseModel):
    id: str
    status: str = Field(description="pass / fail / inconclusive / skipped")
    judged: bool = Field(description="whether the verdict rests on it")
    summary: str


class ModeLine(BaseModel):
    mode: str
    measured_ratio: float | None = Field(None, description="tokens/s over the baseline")
    predicted_ratio: float | None = Field(None, description="the estimator's, for this config and machine")
    step_ms: float | None = None
    compute_ms: float | None = None
    comm_ms: float | None = None
    exposed_comm_ms: float | None = None
    overlap_efficiency: float | None = Field(None, description="the share of the communication hidden, at most 1")
    gain_beyond_comm_ms: float | None = Field(None, description="how much more than the communication the step "
                                              "got shorter by (host work the overlapped order filled)")
    host_issue_ms: float | None = Field(None, description="host issue time of the step's forward + backward")
    peak_memory_mib: float | None = None


class VerificationSummary(BaseModel):
    verdict: str
    headline: str
    criteria: list[CriterionLine]
    modes: list[ModeLine] = Field(default_factory=list)
    why: str | None = Field(None, description="the measured cause of the throughput outcome, one sentence")
    what_would_change_it: list[str] = Field(default_factory=list)
    prediction: str = Field(description="what fed the estimator, or why no prediction is available")
    report: str | None = Field(None, description="path of report.md")


def _ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 3)


def verification_summary(report: VerificationReport) -> VerificationSummary:
    a = report.analysis
    modes = []
    for m in (a.modes if a else []):
        modes.append(ModeLine(mode=m.mode, measured_ratio=m.measured_ratio, predicted_ratio=m.predicted_ratio,
                              step_ms=_ms(m.step_s), compute_ms=_ms(m.compute_s), comm_ms=_ms(m.comm_s),
                              exposed_comm_ms=_ms(m.exposed_comm_s),
                              overlap_efficiency=None if m.overlap_efficiency is None else min(1.0, m.overlap_efficiency),
                              gain_beyond_comm_ms=_ms(m.gain_beyond_comm_s),
                              host_issue_ms=_ms(m.host_issue_s),
                              peak_memory_mib=None if m.peak_memory_bytes is None
                              else round(m.peak_memory_bytes / 2**20, 1)))
    why = a.explanation if a else None
    pred = a.prediction if a else None
    return VerificationSummary(
        verdict=report.verdict, headline=report.summary,
        criteria=[CriterionLine(id=c.id, status=c.status, judged=c.judged, summary=c.summary)
                  for c in report.criteria],
        modes=modes, why=why.cause if why else None, what_would_change_it=list(why.what_would_change_it) if why else [],
        prediction=("not available: " + pred.reason if pred and not pred.available else pred.reason if pred
                    else "not available: the run recorded no step"),
        report=report.files.get("report.md"))


def render_summary(s: VerificationSummary) -> str:
    """The summary as terminal text."""
    lines = [f"verdict: {s.verdict.upper()} - {s.headline}"]
    width = max(len(c.status) for c in s.criteria) if s.criteria else 4
    for c in s.criteria:
        judged = "" if c.judged else " (not judged)"
        lines.append(f"  [{c.status.upper():{width}}] {c.id}{judged}: {c.summary}")
    if s.modes:
        lines.append("  mode            step ms  compute  comm  exposed  measured  predicted")

        def f(x, fmt):
            return "-" if x is None else format(x, fmt)
        for m in s.modes:
            lines.append(f"  {m.mode:<15}{f(m.step_ms, '8.1f')}{f(m.compute_ms, '9.1f')}{f(m.comm_ms, '6.1f')}"
                         f"{f(m.exposed_comm_ms, '9.1f')}  x{f(m.measured_ratio, '.3f'):<8} x{f(m.predicted_ratio, '.3f')}")
    if s.why:
        if s.why not in s.headline:
            lines.append(f"  why: {s.why}")
        if s.what_would_change_it:
            lines.append("  what would change it:")
        lines += [f"    - {x}" for x in s.what_would_change_it]
    lines.append(f"  prediction: {s.prediction}")
    if s.report:
        lines.append(f"report: {s.report}")
    return "\n".join(lines)
