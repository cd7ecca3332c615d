"""estimate_overlap_benefit: `api.py` is the cost model (expert FLOPs and all-to-all bytes per layer, the rates
and the result), `schedules.py` the per-layer costs split over the nodes and each schedule's step (without and
with overlap), `costs.py` what overlap costs beside what it hides (host work, SMs, the GEMMs' SM margin, hardware
queues, the uncertainty band), `host.py` the host-bound floor, `decide.py` the recommendation, `resolve.py` the
defaults and the one error naming every missing input, `model.py` the request and result models, `hardware.py`
the fabric and GPU presets with their sources, `timeline.py` the two-stream timelines the schedules are laid out
on, and `text.py` the stated assumptions and the report for people. The calibration that measures real rates
lives in verify/ (it needs torch).

May import: moe_overlap.skill.models
"""
