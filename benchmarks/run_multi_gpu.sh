#!/usr/bin/env bash
# The multi-GPU measurements on a machine of N GPUs (N = 2, 4 or 8), in two calls of under 10 minutes each.
#
# Through the device tool, from the repository root here (.whl: the wheels the GPU image lacks: pydantic + deps,
# jsonschema + deps, megatron_core, torchtitan + spmd_types, tyro, docstring_parser, typeguard, typing_extensions;
# /work/.library/device/README.md, Notes):
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="PART=layer bash benchmarks/run_multi_gpu.sh")
#   run(kind="nvidia-h200-x2", carry=[".whl"], timeout_s=600, command="PART=verify bash benchmarks/run_multi_gpu.sh")
#
# PART=layer (the MoE layer; benchmarks/gpu/ep_overlap.py, every row side by side in the same processes):
#   1. device check: nvidia-smi, the GPU topology, torch / CUDA / NCCL versions
#   2. pytest tests/gpu (the 2-GPU tests: copy-engine all-to-all == NCCL, layer bitwise with copy engines)
#   3. ep_overlap --a2a nccl            NVLink, NCCL all-to-all (SMs), the three shapes
#   4. ep_overlap --a2a ce              NVLink, copy-engine all-to-all (moe_overlap/ep/transport.py)
#   5. ep_overlap --fabric emulated-net --preset balanced   NCCL's network transport over loopback (P2P and
#      SHM off: an emulated inter-node link, moe_overlap/ep/fabric.py) at the shape that balances compute
#      and communication on it
#   6. profile_layer (torch.profiler traces of none / nodes / 1f1b on every rank; rank 0's trace kept)
# PART=verify (the verification run and the peers):
#   7. moe-overlap verify benchmarks/configs/verify_gpu.yaml --device cuda --nproc N   (throughput binding)
#   8. the same with --fabric emulated-net
#   9. moe-overlap verify --device cuda --nproc N (embedded small model)
#  10. benchmarks/peers/peers.py --world N (ours vs torchtitan's expert parallelism)
# Every step runs under its own `timeout`. Outputs in $OUT (at most 8 files come back): the JSON of each step,
# run_multi_gpu_<part>_rN.log; copy them into benchmarks/results/ and commit them with docs/benchmarks.md.
#
# NVLink multicast stays off in every process (the device machines' rule): the three variables below are
# exported here and inherited by every rank (the benchmarks and the verify launcher copy the environment).
# Usage outside the tool: OUT=/some/dir PART=layer bash benchmarks/run_multi_gpu.sh [N]   (default N: all GPUs)
# CPU dry run of the same sequence (gloo, tiny shapes, the GPU config only planned via --print-launch):
#   MOE_OVERLAP_DRY_CPU=1 OUT=/tmp/dry bash benchmarks/run_multi_gpu.sh 2     (PART defaults to "all")

set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/multi-gpu-out}
PART=${PART:-all}
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
  BENCH=(--preset tiny --rounds 2 --warmup 1); NET=(--preset tiny-balanced --rounds 2 --warmup 1)
  GPU_CFG_EXTRA=(--print-launch torchrun)      # plan + validate the GPU config; launching it is GPU work
  DEFAULT_EXTRA=(--steps 3)
else
  DEV=cuda; N=${1:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')}
  BENCH=(--rounds 12 --warmup 3); NET=(--preset balanced --rounds 6 --warmup 2)
  GPU_CFG_EXTRA=(); DEFAULT_EXTRA=()
fi
LOG=$OUT/run_multi_gpu_${PART}_r$N.log

step() {  # step NAME SECONDS CMD...: run under a timeout, report its exit status, never abort the rest
  local name=$1 limit=$2; shift 2
  echo; echo "=== $name ($(date -u +%FT%TZ), limit ${limit}s): $*"
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "=== $name: exit $rc"
  return "$rc"
}

part_layer() {
  local status=0
  if [ "$DEV" = cuda ] && [ "${GPU_TESTS:-1}" = 1 ]; then  # GPU_TESTS=0: already run in this session's call
    step "gpu tests" 200 "$PY" -m pytest -q -p no:cacheprovider tests/gpu --ignore=tests/gpu/test_verify_gpu.py || status=1
  fi
  step "ep_overlap nccl" 130 "$PY" benchmarks/gpu/ep_overlap.py --device "$DEV" --world "$N" --timeout 120 \
      "${BENCH[@]}" --out "$OUT/ep_overlap_${DEV}_r$N.json" || status=1
  if [ "$DEV" = cuda ]; then
    step "ep_overlap ce" 130 "$PY" benchmarks/gpu/ep_overlap.py --device cuda --world "$N" --timeout 120 --a2a ce \
        "${BENCH[@]}" --out "$OUT/ep_overlap_cuda_r${N}_ce.json" || status=1
  fi
  step "ep_overlap emulated-net" 120 "$PY" benchmarks/gpu/ep_overlap.py --device "$DEV" --world "$N" --timeout 110 \
      --fabric emulated-net --chunks 2 "${NET[@]}" --out "$OUT/ep_overlap_${DEV}_r${N}_emulated-net.json" || status=1
  if [ "$DEV" = cuda ]; then
    step "profile" 80 "$PY" benchmarks/gpu/profile_layer.py --device cuda --world "$N" --timeout 70 --out "$OUT" || status=1
    rm -f "$OUT"/trace_*rank[1-9]*.json.gz
  fi
  return "$status"
}

part_verify() {
  local status=0
  step "verify (GPU-sized config)" 170 "$PY" -m moe_overlap.cli verify benchmarks/configs/verify_gpu.yaml \
      --device "$DEV" --nproc "$N" --timeout 150 --out "$WORK/verify_gpu" --force ${GPU_CFG_EXTRA[@]+"${GPU_CFG_EXTRA[@]}"} || status=1
  if [ "$DEV" = cuda ]; then
    step "verify (GPU-sized config, emulated-net)" 170 "$PY" -m moe_overlap.cli verify \
        benchmarks/configs/verify_gpu.yaml --device cuda --nproc "$N" --fabric emulated-net --timeout 150 \
        --out "$WORK/verify_gpu_net" --force || status=1
  fi
  step "verify (embedded model)" 90 "$PY" -m moe_overlap.cli verify --device "$DEV" --nproc "$N" --timeout 75 \
      --out "$WORK/verify_default" --force ${DEFAULT_EXTRA[@]+"${DEFAULT_EXTRA[@]}"} || status=1
  if [ "$DEV" = cuda ]; then
    step "peers" 120 "$PY" benchmarks/peers/peers.py --world "$N" --timeout 110 --out "$OUT/peers_r$N.json" || status=1
  fi
  for name in verify_gpu verify_gpu_net verify_default; do
    [ -f "$WORK/$name/report.json" ] && cp "$WORK/$name/report.json" "$OUT/${name}_r$N.json"
    [ -f "$WORK/$name/report.md" ] && { echo; echo "=== $name report.md"; cat "$WORK/$name/report.md"; }
  done
  tar czf "$OUT/verify_r$N.tar.gz" -C "$WORK" . 2>/dev/null
  return "$status"
}

main() {
  local status=0
  echo "=== device check ($(date -u +%FT%TZ)), device $DEV, N=$N, part $PART, git $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
  if [ "$DEV" = cuda ]; then nvidia-smi; nvidia-smi topo -m; fi
  env | grep -E '^(NCCL_NVLS_ENABLE|TORCH_SYMM_MEM_DISABLE_MULTICAST|NVSHMEM_DISABLE_NVLS)='
  "$PY" -c 'import torch, pydantic; c = torch.cuda.is_available(); print("torch", torch.__version__, "cuda",
torch.version.cuda, "nccl", torch.cuda.nccl.version() if c else None, "gpus", torch.cuda.device_count(),
"pydantic", pydantic.VERSION)' || return 1
  if [ "$N" -lt 2 ]; then echo "need 2+ ranks for expert parallelism, got N=$N"; return 1; fi
  case "$PART" in
    layer) part_layer || status=1 ;;
    verify) part_verify || status=1 ;;
    all) part_layer || status=1; part_verify || status=1 ;;
    *) echo "PART=$PART: use layer, verify or all"; return 2 ;;
  esac
  rm -rf "$WORK"
  echo; echo "=== done ($(date -u +%FT%TZ)), status $status; files in $OUT:"; ls -la "$OUT"
  return "$status"
}

main 2>&1 | tee "$LOG"
exit "${PIPESTATUS[0]}"
