"""Write a verification's outputs: report.json, report.md, loss.png (torch-free).

report.json is the VerificationReport model dumped as JSON (valid against
schemas/verification-report.schema.json). loss.png needs matplotlib (Agg backend, no display); without it
the plot is skipped and the report says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from moe_overlap.verify.report_model import VerificationReport

_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skipped": "SKIP"}


def plot_losses(report: VerificationReport, path: Path) -> str | None:
    """Loss per step of every mode; returns a note when the plot cannot be made."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "loss.png skipped: matplotlib is not installed (pip install 'moe-overlap[plot]')"
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    styles = {"baseline": ("-", 3.0), "overlap": ("--", 1.8), "overlap+wgrad": (":", 1.8)}
    for run in report.runs:
        if run.steps:
            ls, lw = styles.get(run.mode, ("-", 1.2))
            ax.plot([s.step + 1 for s in run.steps], [s.loss for s in run.steps], ls, lw=lw, label=run.mode)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("LM loss (mean over ranks)")
    loss = next((c for c in report.criteria if c.id == "loss-trajectory"), None)
    comps = loss.evidence.get("comparisons", []) if loss is not None else []
    same = bool(comps) and all(c.get("bitwise_equal") for c in comps)
    ax.set_title(f"moe-overlap verify: {report.verdict}" + (" (curves coincide: bitwise equal)" if same else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


def render_markdown(report: VerificationReport) -> str:
    cfg = report.config
    lines = [f"# Verification report: **{report.verdict}**", "", report.summary, "",
             f"- started {report.started_at}, {report.elapsed_s:.1f} s; {report.environment.nproc} rank(s), "
             f"{report.environment.device} ({report.environment.backend}), torch {report.environment.torch}",
             f"- config: {report.config_source}; EP {cfg.get('expert_model_parallel_size')}, "
             f"{cfg.get('num_moe_experts')} experts, top-{cfg.get('moe_router_topk')}, {cfg.get('precision')}, "
             f"{cfg.get('steps')} steps x {cfg.get('micro_batches')} micro-batches",
             f"- command: `{report.command}`" if report.command else "", "",
             "## Success criteria", "", "| criterion | status | judged | evidence |", "|---|---|---|---|"]
    for c in report.criteria:
        judged = "yes" if c.judged else "no (not binding here)" if not c.binding else "no (not assessed)"
        lines.append(f"| {c.title} | {_MARK[c.status]} | {judged} | "
                     f"{c.summary.replace('|', '/')} |")
    lines += ["", "## Modes", "", "| mode | schedule | overlap | delay wgrad | status | steps | first loss | "
              "last loss | median tokens/s |", "|---|---|---|---|---|---|---|---|---|"]
    for r in report.runs:
        tps = sorted(s.tokens_per_s for s in r.steps[1:]) or [0.0]
        lines.append(f"| {r.mode} | {r.schedule} | {r.overlap_moe_expert_parallel_comm} | {r.delay_wgrad_compute} | "
                     f"{r.status} | {len(r.steps)} | {r.steps[0].loss:.4f} | {r.steps[-1].loss:.4f} | "
                     f"{tps[len(tps) // 2]:.0f} |" if r.steps else
                     f"| {r.mode} | {r.schedule} | {r.overlap_moe_expert_parallel_comm} | {r.delay_wgrad_compute} | "
                     f"{r.status} | 0 | - | - | - |")
    for r in report.runs:
        lines += [f"- {r.mode}: {n}" for n in r.notes]
    if report.failure:
        f = report.failure
        lines += ["", f"## Failure: {f.kind}" + (f" (rank {f.rank})" if f.rank is not None else ""), "", f.message]
        if f.traceback:
            lines += ["", "```", f.traceback.rstrip(), "```"]
        for rank, stack in sorted(f.stacks.items()):
            lines += ["", f"Stacks of rank {rank}:", "", "```", stack.rstrip()[-4000:], "```"]
    extra = report.mapping_notes + report.notes
    if extra:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in extra]
    if report.files:
        lines += ["", "## Files", ""] + [f"- {k}: `{v}`" for k, v in report.files.items()]
    return "\n".join(lines) + "\n"


def write_outputs(report: VerificationReport, out: Path) -> VerificationReport:
    """Write the three files into `out`; returns the report with `files` (and a plot note) filled in."""
    out = Path(out)
    files = {"report.json": str(out / "report.json"), "report.md": str(out / "report.md"),
             "rank logs": str(out / "ranks"), "training logs": str(out / "logs")}
    note = plot_losses(report, out / "loss.png") if any(r.steps for r in report.runs) else "loss.png skipped: no step"
    if note is None:
        files["loss.png"] = str(out / "loss.png")
    report = report.model_copy(update={"files": files, "notes": report.notes + ([note] if note else [])})
    (out / "report.json").write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    return report
