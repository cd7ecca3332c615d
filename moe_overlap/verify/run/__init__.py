"""Running the ranks of a verification: launchers, the worker and its training loop, the records they write.

launcher.py (local ranks under a heartbeat watchdog), ranks.py (spawn_ranks for in-process callers),
launch_print.py (the torchrun command and the sbatch script), slurm_job.py (sbatch, squeue/scontrol/sacct,
scancel), slurm_run.py (a verification as one Slurm job: submitted, tracked, judged, cancelled), worker.py (one rank:
``python -m moe_overlap.verify.run.worker``), baseline_transport.py (the baseline's all-to-all: the faster alone
of NCCL and copy engines under --a2a auto), train.py (the training loop, torch), corpus.py + data/corpus.txt
(the tokens), records.py (per-step records and logs), interrupts.py (Ctrl-C), progress.py (one growing count).
Torch only inside the ranks.

May import: moe_overlap.skill.files, moe_overlap.ep, moe_overlap.verify.plan, moe_overlap.verify.judge.attribution,
moe_overlap.verify.judge.throughput, moe_overlap.verify.calibrate.pieces, moe_overlap.verify.judge.offline,
moe_overlap.verify.judge.report_model, moe_overlap.verify.api, moe_overlap.verify.rundir
"""
