"""The agent side of moe-overlap, torch-free: one subpackage per capability, each behind what it may import.

    card/      the skill card and evals (models, loading with file:line problems, the schema registry)
    config/    a training config (YAML / JSON / dict / Megatron-LM argv / overrides) -> OverlapConfig
    rules/     the constraints as data, the environment and release lines they read, validate_config
    generate/  generate_config: requests, presets, rollout stages, rendering
    estimate/  estimate_overlap_benefit: cost model, hardware presets, two-stream timelines
    diagnose/  diagnose (failure modes of the card) and check_training_log

Nothing here imports torch, Transformer Engine, Megatron, MCP, or ``moe_overlap.ep`` / ``verify`` /
``mcp`` / ``commands`` (tests/unit/test_layout.py checks it: each subpackage's docstring ends with the
``May import:`` line the test enforces). The subpackages import each other in one direction only
(card, config, estimate <- rules <- generate; card <- diagnose), and this file imports nothing, so
importing one capability never loads another. Import the modules directly.
"""
