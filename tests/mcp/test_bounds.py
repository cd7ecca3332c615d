"""Bounded outputs: long step lists and tracebacks are cut, and the result says where the full data is."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from moe_overlap.mcp.results import bounded_report
from moe_overlap.mcp.safety import MAX_LIST_ITEMS


class _Report(BaseModel):  # the fields bounded_report reads, as a VerificationReport has them
    out_dir: str
    runs: list[dict[str, Any]]
    failure: dict[str, Any] | None = None


def test_long_step_lists_and_tracebacks_are_cut_with_a_pointer():
    steps = [{"step": i} for i in range(500)]
    report = _Report(out_dir="/runs/r1", runs=[{"mode": "baseline", "steps": steps},
                                               {"mode": "overlap", "steps": steps[:10]}],
                     failure={"traceback": "x" * 20_000})
    data, cuts = bounded_report(report)
    kept = data["runs"][0]["steps"]
    assert len(kept) == MAX_LIST_ITEMS and kept[0] == {"step": 0} and kept[-1] == {"step": 499}
    assert data["runs"][1]["steps"] == steps[:10]
    assert len(data["failure"]["traceback"]) < 8100
    assert [c.omitted for c in cuts] == [500 - MAX_LIST_ITEMS, 20_000 - 8000]
    assert all(c.where.startswith("/runs/r1/report.json") for c in cuts)


def test_small_report_is_untouched():
    report = _Report(out_dir="/r", runs=[{"mode": "baseline", "steps": [{"step": 0}]}])
    data, cuts = bounded_report(report)
    assert data == report.model_dump(mode="json") and cuts == []
