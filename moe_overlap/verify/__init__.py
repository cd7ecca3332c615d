"""Verification runs of the included MoE implementation (torch runs only in the spawned ranks).

api.run_verification(options, progress, cancel) -> VerificationReport is the entry point. One subpackage per
job: plan/ decides (options, config, modes, output folder, validation), run/ starts the ranks (launcher.py:
worker.py + train.py under a heartbeat watchdog), judge/ applies the success criteria, names the rank that
failed first, explains the times and writes report.json/.md/loss.png, calibrate/ measures this machine for
the estimator.
"""
