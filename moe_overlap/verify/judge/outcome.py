"""What a finished verification answers a script or an assistant: the summary first, then where the report is.

`moe-overlap verify --format json` prints a `VerificationOutcome`; the MCP verification tools return the same
summary and failure beside the job's state (mcp/results.py), the report itself being a resource there. The
whole report (every step of every mode, the evidence of each criterion) is report.json in the run's folder.
Torch-free.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from moe_overlap.verify.judge.report_model import VerificationReport
from moe_overlap.verify.judge.summary import VerificationSummary, verification_summary


class VerificationOutcome(BaseModel):
    summary: VerificationSummary
    failure: str | None = Field(None, description="what failed, when a rank or the launch did")
    report: str = Field(description="path of report.json: every step, each criterion's evidence")
    out_dir: str = Field(description="the run's folder")


def outcome(report: VerificationReport) -> VerificationOutcome:
    return VerificationOutcome(summary=verification_summary(report),
                               failure=report.failure.message if report.failure is not None else None,
                               report=report.files.get("report.json", f"{report.out_dir}/report.json"),
                               out_dir=report.out_dir)
