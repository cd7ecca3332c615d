"""What sharing the GPU with communication kernels costs the expert GEMMs (one GPU, no all-to-all)."""
