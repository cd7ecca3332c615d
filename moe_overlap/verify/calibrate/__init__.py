"""Calibrating the estimator on this machine: probes of our own implementation, the pieces of a run's step.

machine.py (calibrate(): GEMM rate, gather cost, all-to-all, overlap efficiency, in spawned ranks), pieces.py
(the step's all-to-alls, count exchanges and expert GEMMs timed alone inside a verification's ranks),
run_calibration.py (a Calibration from those pieces, for the explanation).

May import: moe_overlap.verify.rundir, moe_overlap.ep, moe_overlap.skill.estimate, moe_overlap.verify.run.ranks,
moe_overlap.verify.judge.analysis_model
"""
