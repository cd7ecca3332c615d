"""moe-overlap: Mixture-of-Experts expert-parallel communication overlap.

Sub-packages:
  ep/      the overlapped MoE implementation (torch)
  skill/   torch-free agent logic: card/, config/, rules/, generate/, estimate/, diagnose/
  verify/  verification runs: launcher, worker, report
"""

__version__ = "0.1.0"
