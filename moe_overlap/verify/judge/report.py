"""Write a verification's outputs: report.json, report.md, loss.png (torch-free).

report.json is the VerificationReport model dumped as JSON (valid against
schemas/verification-report.schema.json). loss.png needs matplotlib (Agg backend, no display); without it
the plot is skipped and the report says so.
"""

from __future__ import annotations

import json
from pathlib import Path

from moe_overlap.verify.judge.analysis_model import hidden_share
from moe_overlap.verify.judge.report_model import VerificationReport
from moe_overlap.verify.rundir.write import write_text, write_with

_MARK = {"pass": "PASS", "fail": "FAIL", "inconclusive": "INCONCLUSIVE", "skipped": "SKIP"}


def plot_losses(report: VerificationReport, path: Path) -> str | None:
    """Loss per step of every mode (left) and step time per mode (right: each step, the median after the warm-up
    as a line, the throughput outcome in the legend); returns a note when the plot cannot be made."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "loss.png skipped: matplotlib is not installed (pip install 'moe-overlap[plot]')"
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.2), dpi=100)
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
    ax.set_title("loss" + (" (curves coincide: bitwise equal)" if same else ""))
    ax.grid(alpha=0.3)
    ax.legend()
    _plot_step_times(bx, report)
    fig.suptitle(f"moe-overlap verify: {report.verdict}")
    fig.tight_layout()
    try:  # into a new file in the run folder, then renamed over the name (a link there is replaced)
        write_with(path.parent, path.name, lambda f: fig.savefig(f, format="png"))
    finally:
        plt.close(fig)
    return None


def _plot_step_times(ax, report: VerificationReport) -> None:
    tp = next((c for c in report.criteria if c.id == "throughput"), None)
    outcome = {c["mode"]: c for c in (tp.evidence.get("comparisons", []) if tp else []) if "ratio" in c}
    top = 0.0
    for run in report.runs:
        if not run.steps:
            continue
        xs, ys = [s.step + 1 for s in run.steps], [s.step_time_s * 1e3 for s in run.steps]
        c = outcome.get(run.mode)
        label = run.mode + (f": x{c['ratio']:.3f} tokens/s, {c['outcome']}" if c else "")
        line = ax.plot(xs, ys, "o-", ms=3, lw=1, alpha=0.8, label=label)[0]
        kept = sorted(ys[1:] or ys)
        top = max(top, kept[-1])
        ax.axhline(kept[len(kept) // 2], color=line.get_color(), lw=1, ls="--", alpha=0.6)
    if top > 0:
        ax.set_ylim(0, top * 1.25)  # the warm-up step (compiles, allocates) may lie above: it is not compared
    ax.set_xlabel("optimizer step (step 1: warm-up, not compared)")
    ax.set_ylabel("step time, ms (slowest rank)")
    judged = "judged" if tp is not None and tp.judged else "not judged"
    ax.set_title(f"step time, dashed: median (throughput {judged})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _analysis_lines(report: VerificationReport) -> list[str]:
    a = report.analysis
    if a is None:
        return []
    lines = ["", "## Where the step time goes", ""]
    if not a.available:
        lines += [f"Not measured: {a.reason}", ""]
    ms = 1e3

    def f(x, scale=ms, fmt=".1f"):
        return "-" if x is None else format(x * scale, fmt)

    lines += ["| mode | step ms | compute ms | comm ms | exposed comm ms | hidden comm ms | overlap efficiency | "
              "peak MiB | measured x | predicted x | error |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    beyond_notes = []
    for m in a.modes:
        # Recomputed from the row, so a report written before the cap renders the same way.
        eff, beyond = hidden_share(m.step_s, m.compute_s, m.comm_s)
        if eff is None:
            eff = None if m.overlap_efficiency is None else min(1.0, m.overlap_efficiency)
        mark = ""
        if beyond is not None:  # then step, compute and comm are all known
            mark = "\\*"
            beyond_notes.append(f"{m.mode}: the step got {(m.compute_s + m.comm_s - m.step_s) * ms:.1f} ms shorter "
                                f"than the baseline's while the communication it could hide took "
                                f"{min(m.compute_s, m.comm_s) * ms:.1f} ms; the {beyond * ms:.1f} ms beyond that "
                                "came from host work the overlapped order filled (or noise), not from hiding "
                                "communication")
        lines.append(f"| {m.mode} | {f(m.step_s)} | {f(m.compute_s)} | {f(m.comm_s)} | {f(m.exposed_comm_s)} | "
                     f"{f(m.hidden_comm_s)} | {f(eff, 1, '.2f')}{mark} | "
                     f"{f(m.peak_memory_bytes, 1 / 2**20)} | {f(m.measured_ratio, 1, '.3f')} | "
                     f"{f(m.predicted_ratio, 1, '.3f')} | {f(m.prediction_error, 100, '+.0f')}{'' if m.prediction_error is None else '%'} |")
    if beyond_notes:
        lines += ["", "\\* The gain exceeds the all-to-all time, so the efficiency (the share of the communication "
                      "hidden) is shown at its cap of 1.00. " + "; ".join(beyond_notes) + "."]
    if a.pieces is not None:
        p = a.pieces
        lines += ["", f"Timed alone in the same ranks after training ({p.layers} layers x {p.micro_batches} "
                      f"micro-batches, slowest rank, median of {p.rounds} rounds): all-to-alls {p.a2a_s * ms:.1f} ms "
                      f"({p.a2a_calls} calls, {p.a2a_bytes_off_rank / 1e6:.2f} MB off-rank), count exchanges "
                      f"{p.count_exchange_s * ms:.1f} ms, expert GEMMs {p.experts_s * ms:.1f} ms; overlap probe "
                      f"(one dispatch beside one expert forward): "
                      + (f"{p.probe.overlap_efficiency:.2f}" if p.probe.overlap_efficiency is not None else "n/a")
                      + ". compute = baseline step - comm; exposed = step - compute (docs/verify.md)."
                      + (f" Layers alone, no overlap: {p.layer_s * ms:.1f} ms, of which the host took "
                         f"{p.layer_host_s * ms:.1f} ms to issue ({p.host_ms_per_layer:.3f} ms per layer and "
                         "micro-batch: the estimator's host_ms on CUDA)." if p.layer_s is not None
                         and p.layer_host_s is not None and p.host_ms_per_layer is not None else "")]
    issued = [m for m in a.modes if m.host_issue_s is not None and m.step_s]
    if issued:
        lines += ["", "Host issue time per step (forward + backward queued, optimizer excluded; includes the "
                      "host's waits at the count exchanges): " + ", ".join(
                          f"{m.mode} {m.host_issue_s * ms:.1f} of {m.step_s * ms:.1f} ms" for m in issued) + "."]
    pr = a.prediction
    lines += ["", "Prediction: " + (pr.reason + (f"; overlap efficiency {pr.overlap_efficiency:.2f} "
                                                 f"({pr.efficiency_source})" if pr.overlap_efficiency is not None
                                                 else "") if pr.available else "not available: " + pr.reason)]
    if pr.available and pr.host_note:
        paced = (f" (predicted at the host's pace: {', '.join(pr.host_bound)})" if pr.host_bound else "")
        lines += ["", f"Host: {pr.host_note}{paced}."]
    if a.explanation is not None:
        e = a.explanation
        lines += ["", "## Why", "", e.cause + "."]
        if e.what_would_change_it:
            lines += ["", "What would change it:", ""] + [f"- {x}" for x in e.what_would_change_it]
    return lines


def render_markdown(report: VerificationReport) -> str:
    cfg = report.config
    lines = [f"# Verification report: **{report.verdict}**", "", report.summary, "",
             f"- started {report.started_at}, {report.elapsed_s:.1f} s; {report.environment.nproc} rank(s), "
             f"{report.environment.device} ({report.environment.backend}), torch {report.environment.torch}",
             f"- config: {report.config_source}; EP {cfg.get('expert_model_parallel_size')}, "
             f"{cfg.get('num_moe_experts')} experts, top-{cfg.get('moe_router_topk')}, {cfg.get('precision')}, "
             f"{cfg.get('steps')} steps x {cfg.get('micro_batches')} micro-batches",
             f"- command: `{report.command}`" if report.command else "",
             f"- fabric {report.environment.fabric}; all-to-all: {report.environment.a2a_transport or 'not recorded'}"
             + (f"; the baseline's: {report.environment.baseline_transport}"
                if report.environment.baseline_transport else "")
             + (f"; SM margin of the 1f1b expert GEMMs: {report.environment.sm_margin}"
                if report.environment.sm_margin else "")
             + (f"; CUDA graphs: {report.environment.graphs}" if report.environment.graphs else ""),
             "",
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
    lines += _analysis_lines(report)
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
    # Never through a link: a name in the folder may have been replaced by anyone (verify/rundir/write.py).
    write_text(out, "report.json", json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
    write_text(out, "report.md", render_markdown(report))
    return report
