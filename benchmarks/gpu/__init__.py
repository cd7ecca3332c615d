"""GPU benchmarks of our MoE layer: every schedule at production shapes (ep_overlap + its rank body), the
expert path and sections on one GPU (gpu_layer, gpu_sections), the grouped GEMM rate, the layer and the
training step by schedule, profiles (profile_layer + its rank body, trace_summary) and the host ops per
step. CPU runs on gloo ranks are their smoke tests."""
