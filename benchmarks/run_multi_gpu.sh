#!/usr/bin/env bash
# Issue 11 in ONE call per machine kind: the multi-GPU A/B runs on a machine of N GPUs (N = 2, 4 or 8).
#
# Through the device tool (from the repository root here; the wheels in .whl are pydantic, pydantic_core,
# annotated_types, typing_inspection, jsonschema + deps, megatron_core: the GPU image lacks them, see
# /work/.library/device/README.md, Notes), one call per kind:
#
#   run(kind="nvidia-h200-x8", carry=[".whl"], timeout_s=600, command="bash benchmarks/run_multi_gpu.sh")
#   run(kind="nvidia-h200-x4", carry=[".whl"], timeout_s=600, command="bash benchmarks/run_multi_gpu.sh")
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="bash benchmarks/run_multi_gpu.sh")
#
# The script installs the wheels itself, first thing:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site
# then, each step under its own `timeout` so that one stuck step leaves time for the others (~8.5 min in all,
# a normal run takes 2-4 min):
#   1. device check: nvidia-smi, the GPU topology, torch / CUDA / NCCL versions, GPUs torch sees
#   2. python3 benchmarks/ep_overlap.py --device cuda --world N      (layer: none/chunked/1f1b/1f1b+wgrad,
#      a2a and experts alone, DSv3 proxy vs Megatron-Core's 7.12/10.48 ms)
#   3. moe-overlap verify benchmarks/configs/verify_gpu.yaml --device cuda --nproc N   (GPU-sized model, bf16)
#   4. moe-overlap verify --device cuda --nproc N                       (embedded small model, bf16 on cuda)
# and leaves in $OUT (at most 8 files come back): ep_overlap_cuda_rN.json, verify_gpu_rN.json and
# verify_default_rN.json (the report.json of each verification), verify_rN.tar.gz (both verification folders:
# report.md, loss.png, per-rank logs and records), run_multi_gpu_rN.log (everything printed).
# Copy the JSONs into benchmarks/results/ and commit them with docs/benchmarks.md's "Multi-GPU" section.
#
# NVLink multicast stays off in every process (the device machines' rule): the three variables below are
# exported here and inherited by every rank (benchmarks/ep_overlap.py and the verify launcher copy the
# environment; ep_overlap's ranks refuse to run without them).
# Usage outside the tool: OUT=/some/dir bash benchmarks/run_multi_gpu.sh [N]   (default N: all GPUs)
# CPU dry run of the same sequence (gloo, tiny shapes, the GPU config only planned via --print-launch):
#   MOE_OVERLAP_DRY_CPU=1 OUT=/tmp/dry bash benchmarks/run_multi_gpu.sh 2

set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/multi-gpu-out}
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/moe-overlap-multi-gpu.XXXXXX)
PY=${PYTHON:-python3}

if [ -z "${MOE_OVERLAP_DRY_CPU:-}" ] && compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || { echo "wheel install failed"; exit 1; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}

if [ -n "${MOE_OVERLAP_DRY_CPU:-}" ]; then
  DEV=cpu; N=${1:-2}
  BENCH_EXTRA=(--preset tiny --rounds 2 --warmup 1)
  GPU_CFG_EXTRA=(--print-launch torchrun)      # plan + validate the GPU config; launching it is GPU work
  DEFAULT_EXTRA=(--steps 3)
else
  DEV=cuda; N=${1:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
  BENCH_EXTRA=(); GPU_CFG_EXTRA=(); DEFAULT_EXTRA=()
fi
LOG=$OUT/run_multi_gpu_r$N.log

step() {  # step NAME SECONDS CMD...: run under a timeout, report its exit status, never abort the rest
  local name=$1 limit=$2; shift 2
  echo; echo "=== $name ($(date -u +%FT%TZ), limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc"
  return "$rc"
}

main() {
  local status=0
  echo "=== device check ($(date -u +%FT%TZ)), device $DEV, N=$N, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if [ "$DEV" = cuda ]; then nvidia-smi; nvidia-smi topo -m; fi
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
  "$PY" -c 'import torch, pydantic; c = torch.cuda.is_available(); print("torch", torch.__version__, "cuda",
torch.version.cuda, "nccl", torch.cuda.nccl.version() if c else None, "gpus", torch.cuda.device_count(),
"pydantic", pydantic.VERSION)' || return 1
  if [ "$N" -lt 2 ]; then echo "need 2+ ranks for expert parallelism, got N=$N"; return 1; fi

  step "ep_overlap benchmark" 260 "$PY" benchmarks/ep_overlap.py --device "$DEV" --world "$N" --timeout 240 \
      ${BENCH_EXTRA[@]+"${BENCH_EXTRA[@]}"} --out "$OUT/ep_overlap_${DEV}_r$N.json" || status=1
  step "verify (GPU-sized config)" 170 "$PY" -m moe_overlap.cli verify benchmarks/configs/verify_gpu.yaml \
      --device "$DEV" --nproc "$N" --timeout 150 --out "$WORK/verify_gpu" --force ${GPU_CFG_EXTRA[@]+"${GPU_CFG_EXTRA[@]}"} || status=1
  step "verify (embedded model)" 90 "$PY" -m moe_overlap.cli verify --device "$DEV" --nproc "$N" --timeout 75 \
      --out "$WORK/verify_default" --force ${DEFAULT_EXTRA[@]+"${DEFAULT_EXTRA[@]}"} || status=1

  for name in verify_gpu verify_default; do
    [ -f "$WORK/$name/report.json" ] && cp "$WORK/$name/report.json" "$OUT/${name}_r$N.json"
    [ -f "$WORK/$name/report.md" ] && { echo; echo "=== $name report.md"; cat "$WORK/$name/report.md"; }
  done
  tar czf "$OUT/verify_r$N.tar.gz" -C "$WORK" . 2>/dev/null
  rm -rf "$WORK"
  echo; echo "=== done ($(date -u +%FT%TZ)), status $status; files in $OUT:"; ls -la "$OUT"
  return "$status"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
