"""The verification tools' result: a job's state, progress and outcome, kept small.

The other tools return the `skill/` models as they are. A verification's result is its status and summary,
never the whole report: the report (every step of every mode) is a resource of the job,
`moe-overlap://jobs/<job_id>/report.json`, read on demand. Torch-free.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from moe_overlap.jsonout import compact_json
from moe_overlap.verify.judge.summary import VerificationSummary
from moe_overlap.verify.run.progress import RunProgress

MAX_STATUS_CHARS = 3500  # a verification result, as compact JSON; the report resource has everything
MIN_CUT_CHARS = 80
CUT_MARK = " [...]"


class VerificationStatus(BaseModel):
    job_id: str
    state: Literal["running", "succeeded", "failed", "cancelled"] = Field(
        description="succeeded: the run finished (its verdict is in summary)")
    elapsed_s: float
    progress: RunProgress | None = None
    summary: VerificationSummary | None = Field(None, description="when finished (verify/judge/summary.py)")
    failure: str | None = Field(None, description="what failed, when a rank or the launch did")
    report_uri: str | None = Field(None, description="resources/read it for the full report (every step, "
                                                     "criterion evidence)")
    out_dir: str | None = Field(None, description="the run's folder on the server's machine")
    cut: bool = Field(False, description="true: long texts were shortened to fit; the report has them whole")
    error: str | None = None
    live_child_processes: list[int] | None = Field(
        None, description="verification processes still running (cancel_verification only); [] is clean")
    next_step: str


def fit(status: VerificationStatus, limit: int = MAX_STATUS_CHARS) -> VerificationStatus:
    """The status within `limit` characters: the longest texts of the summary and the failure are cut first.

    Why not a fixed cap per field: which text is long depends on the run (a failure's message, the
    explanation, one criterion per mode); cutting the longest first keeps every field readable.
    """
    data = status.model_dump(mode="json")
    while len(compact_json(data)) > limit:
        texts = list(_texts(data))
        if not texts:
            break
        holder, key, text = max(texts, key=lambda t: len(t[2]))
        if len(text) <= MIN_CUT_CHARS:
            break
        excess = len(compact_json(data)) - limit
        keep = max(MIN_CUT_CHARS, len(text) // 2, len(text) - excess - len(CUT_MARK))
        holder[key] = text[:keep].rstrip() + CUT_MARK
        data["cut"] = True
    return VerificationStatus.model_validate(data)


def _texts(data: dict[str, Any]):
    """(container, key, text) of every free text in the failure and the summary (not ids or verdicts)."""
    if isinstance(data.get("failure"), str):
        yield data, "failure", data["failure"]
    todo = [data["summary"]] if isinstance(data.get("summary"), dict) else []
    while todo:
        node = todo.pop()
        for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
            if isinstance(value, str) and key not in ("verdict", "id", "status", "mode", "report"):
                yield node, key, value
            elif isinstance(value, dict | list):
                todo.append(value)
