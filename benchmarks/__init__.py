"""Benchmark scripts, grouped by subject; committed results in results/ (JSON with command, date, machine).

gpu/ the MoE layer, its schedules and profiles (ep_overlap, gpu_layer, gemm_rate, layer, step,
profile_layer, host_ops), peers/ ours beside torchtitan's and Megatron-Core's layers, estimator/ the
estimator against measured times, fuzz/ hostile input to every CLI command and MCP tool, cpu/ CPU timings of
the agent side (validation, MCP start-up, a default verification), common/ the timing helpers they share.

Run a script by its path from the repository root (``python benchmarks/gpu/ep_overlap.py ...``): it puts the
root first on sys.path and imports its neighbours as ``benchmarks.<folder>.<module>`` (a regular package,
so no installed ``benchmarks`` shadows it, and spawned ranks unpickle their function by that name).
"""
