"""What the benchmarks share: timing (CUDA events, the all-rank Clock, ceilings, profiler, host syncs)."""
