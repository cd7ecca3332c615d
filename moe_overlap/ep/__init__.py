"""The overlapped expert-parallel MoE implementation (torch). Knows nothing of MCP, YAML or cards.

router.py (route -> Routing), all_to_all.py (async handle + autograd a2a), counts.py (token-count
exchange, dispatch plans), dispatcher.py (dispatch / combine and their plain steps), transport.py
(copy-engine all-to-all over symmetric memory), fabric.py (NCCL fabric environments, torch-free),
experts.py (grouped SwiGLU, dgrad/wgrad split), wgrad.py (WgradStore), streams.py (CUDA comm stream
helpers), schedule.py (layer schedules none / chunked), nodes.py + schedule_1f1b.py (the 1F1B overlap),
layer.py (MoELayer), model.py + step.py (the small LM of verification runs), refs.py (slow references),
sync_free.py (the host-sync-free EP path: device counts, equal-block all-to-alls), graphed.py and
node_graphs.py (CUDA graphs of a layer and of the nodes' experts node).
Import the submodules directly; this package imports nothing eagerly.
"""
