"""Judging a verification and reporting it: criteria, throughput, the failing rank, the explanation.

criteria.py (the four success criteria), throughput.py (the throughput comparison and its tolerance),
attribution.py (which rank failed first and why), explain.py + analysis_model.py (why overlap paid or
did not), report_model.py + report.py (report.json/.md/loss.png), summary.py + outcome.py (what the CLI
and the MCP tools return), offline.py (judge again from a finished run's folder). Torch-free.

May import: moe_overlap.verify.rundir, moe_overlap.skill.estimate, moe_overlap.skill.files, moe_overlap.verify.plan,
moe_overlap.verify.run.launcher, moe_overlap.verify.run.records, moe_overlap.verify.calibrate.run_calibration,
moe_overlap.verify.api
"""
