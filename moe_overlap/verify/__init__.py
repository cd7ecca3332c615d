"""Verification runs of the included MoE implementation (torch runs only in the spawned ranks).

api.run_verification(options, progress, cancel) -> VerificationReport is the entry point; plan.py decides
(config, ranks, modes, output folder, validation), outdir.py makes the output folder the run's own, launcher.py
runs the ranks (worker.py + train.py) under a heartbeat watchdog and attribution.py names the rank that failed
first, judge.py applies the four success criteria, report.py writes report.json/.md/loss.png.
"""
