#!/usr/bin/env bash
# The single-GPU measurements in ONE call to the lent `nvidia-h200` (EP 1: no communication; what the layer
# costs beyond its expert GEMMs, the schedules' host overhead, the peers), before and after a change side by side.
#
# Through the device tool, from the repository root here:
#   git archive <before-commit> moe_overlap | tar -x -C .baseline     # the "before" code (ignored folder)
#   run(kind="nvidia-h200", carry=[".whl", ".baseline"], timeout_s=600,
#       command="BEFORE=<before-commit> bash benchmarks/run_single_gpu.sh")
# .whl holds the wheels the GPU image lacks (pydantic + deps, jsonschema + deps, megatron_core, torchtitan
# + spmd_types, tyro, docstring_parser, typeguard, typing_extensions; device README, Notes).
#
# Steps, each under its own timeout (a stuck one leaves time for the others), all output in $OUT/run_single_gpu.log:
#   1. device check; 2. pytest tests/gpu (CUDA paths: experts, layer, 1F1B bitwise, transports, no host sync
#   at EP 1); 3./4. benchmarks/gpu_layer.py --sections experts layer with the before code (.baseline) and with
#   this checkout; 5. benchmarks/profile_layer.py --world 1 (traces + host profiles); 6. benchmarks/ep_overlap.py
#   --world 1; 7. benchmarks/peers.py (ours vs torchtitan vs Megatron-Core at EP 1).
# Results: $OUT/{gpu_layer_before,gpu_layer_after,profile_cuda_r1,ep_overlap_cuda_r1,peers_r1}.json and the
# rank-0 traces (trace_*.json.gz); copy them to benchmarks/results/ and commit with docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/single-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-"tests before after profile ep_overlap peers"}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  case " $SECTIONS " in *" $name "*) ;; *) echo "=== $name: skipped"; return 0;; esac
  echo; echo "=== $name ($(date -u +%FT%TZ), limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@"
  echo "=== $name: exit $?"
}

main() {
  echo "=== device check ($(date -u +%FT%TZ)), git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), before ${BEFORE:-?}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.draw --format=csv
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  step tests 150 "$PY" -m pytest -q -x -p no:cacheprovider tests/gpu
  if [ -d .baseline/moe_overlap ]; then
    BENCH_CODE_ROOT=.baseline BENCH_CODE_COMMIT=${BEFORE:-baseline} \
      step before 100 "$PY" benchmarks/gpu_layer.py --sections experts layer --out "$OUT/gpu_layer_before.json"
  fi
  step after 100 "$PY" benchmarks/gpu_layer.py --sections experts layer --out "$OUT/gpu_layer_after.json"
  step profile 90 "$PY" benchmarks/profile_layer.py --device cuda --world 1 --out "$OUT"
  step ep_overlap 90 "$PY" benchmarks/ep_overlap.py --device cuda --world 1 --rounds 8 --warmup 2 --timeout 80 \
    --out "$OUT/ep_overlap_cuda_r1.json"
  step peers 120 "$PY" benchmarks/peers.py --out "$OUT/peers_r1.json"
  echo; echo "=== done ($(date -u +%FT%TZ)); files in $OUT:"; ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run_single_gpu.log"
