"""The overlapped expert-parallel MoE implementation (torch). Knows nothing of MCP, YAML or cards.

router.py (route -> Routing), all_to_all.py (async handle + autograd a2a), dispatcher.py (dispatch /
combine and their plain steps), experts.py (grouped SwiGLU, dgrad/wgrad split), wgrad.py (WgradStore),
streams.py (CUDA comm stream helpers), schedule.py (layer schedules none / chunked), layer.py (MoELayer),
refs.py (slow references). Import the submodules directly; this package imports nothing eagerly.
"""
