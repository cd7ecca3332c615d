#!/usr/bin/env bash
# The single-GPU measurements in ONE call to the lent `nvidia-h200` (EP 1: no communication; what the layer
# costs beyond its expert GEMMs, the schedules' host overhead, the peers), before and after a change side by side.
#
# Through the device tool, from the repository root here:
#   git archive <commit> moe_overlap | tar -x -C <dir>     # each earlier version to measure (ignored folders)
#   run(kind="nvidia-h200", carry=[".whl", "<dir>", ...], timeout_s=600,
#       command="CODE_ROOTS='<label>=<dir> ...' bash benchmarks/run_single_gpu.sh")
# .whl holds the wheels the GPU image lacks (pydantic + deps, jsonschema + deps, megatron_core, torchtitan
# + spmd_types, tyro, docstring_parser, typeguard, typing_extensions; device README, Notes).
#
# Steps, each under its own timeout (a stuck one leaves time for the others), all output in $OUT/run_single_gpu.log:
#   1. device check; 2. pytest tests/gpu (CUDA paths: experts, layer, 1F1B bitwise, transports, no host sync
#   at EP 1), while the grouped_gemm extension (Megatron-Core's GroupedMLP) tries to build from .whl-src if
#   carried; 3. benchmarks/gpu/gpu_layer.py --sections experts layer for each CODE_ROOTS version, then this checkout
#   (an ablation: one version per change); 4. benchmarks/gpu/profile_layer.py --world 1 (host profiles, trace
#   summaries); 5. benchmarks/gpu/ep_overlap.py --world 1; 6. benchmarks/peers/peers.py (ours vs torchtitan vs Megatron-Core);
#   opt-in: 7. `verify` (moe-overlap verify --device cuda: the one-GPU EP 1 check, CUDA graphs auto);
#   8. `graph` (gpu_layer.py --sections graph --graph-sync-free: the sync-free path graphed, at world 1);
#   9. `beside` (contention/gemm_beside.py: the expert GEMMs beside a kernel holding k SMs, by SM margin).
# Results: $OUT/gpu_layer_<label>.json, gpu_layer_after.json, profile_cuda_r1.json, ep_overlap_cuda_r1.json,
# peers_r1.json; copy them to benchmarks/results/ and commit with docs/benchmarks.md.
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/single-gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SECTIONS=${SECTIONS:-"tests before after profile ep_overlap peers"}
CODE_ROOTS=${CODE_ROOTS:-}
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

build_grouped_gemm() {  # Megatron-Core's GroupedMLP needs this CUDA extension; no network here, so from the sdist
  local nv; nv=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
  echo "nvcc: ${nv:-none}"; [ -n "$nv" ] && "$nv" --version | tail -2
  [ -n "$nv" ] || { echo "build rc=no-compiler"; return 0; }
  "$PY" -m pip install -q --no-index --no-deps --no-cache-dir --target /tmp/bt .whl-src/*.whl
  PATH=/tmp/bt/bin:$(dirname "$nv"):$PATH PYTHONPATH=/tmp/bt:${PYTHONPATH:-} TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=12 \
    timeout 140 "$PY" -m pip install --no-index --no-deps --no-build-isolation --no-cache-dir --target /tmp/gg \
    .whl-src/grouped_gemm-*.tar.gz
  echo "build rc=$?"
}

main() {
  echo "=== device check ($(date -u +%FT%TZ)), git $(git rev-parse --short HEAD 2>/dev/null || echo '?'), code roots ${CODE_ROOTS:-none}"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,power.draw --format=csv
  "$PY" -c 'import torch, triton; print("torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__)'
  local gg_pid=
  if compgen -G ".whl-src/grouped_gemm-*.tar.gz" > /dev/null; then  # CPU work: beside the (untimed) tests only
    build_grouped_gemm > "$OUT/grouped_gemm_build.log" 2>&1 & gg_pid=$!
  fi
  step tests 240 "$PY" -m pytest -q -x -p no:cacheprovider tests/gpu
  [ -n "$gg_pid" ] && { wait "$gg_pid"; tail -3 "$OUT/grouped_gemm_build.log"; }
  for pair in $CODE_ROOTS; do
    BENCH_CODE_ROOT=${pair#*=} BENCH_CODE_COMMIT=${pair%%=*} \
      step before 100 "$PY" benchmarks/gpu/gpu_layer.py --sections experts layer --out "$OUT/gpu_layer_${pair%%=*}.json"
  done
  step after 100 "$PY" benchmarks/gpu/gpu_layer.py --sections experts layer --out "$OUT/gpu_layer_after.json"
  step profile 90 "$PY" benchmarks/gpu/profile_layer.py --device cuda --world 1 --out "$OUT"
  rm -f "$OUT"/trace_*.json.gz  # at most 8 files come back; the summaries are in profile_cuda_r1.json
  step ep_overlap 90 "$PY" benchmarks/gpu/ep_overlap.py --device cuda --world 1 --rounds 8 --warmup 2 --timeout 80 \
    --out "$OUT/ep_overlap_cuda_r1.json"
  PYTHONPATH=/tmp/gg${PYTHONPATH:+:$PYTHONPATH} step peers 120 "$PY" benchmarks/peers/peers.py --out "$OUT/peers_r1.json" \
    $([ -f "$OUT/grouped_gemm_build.log" ] && echo --grouped-gemm-log "$OUT/grouped_gemm_build.log")
  # #28's one-H200 line and #31's graphed sync-free path (opt-in sections: SECTIONS="tests verify graph")
  step verify 200 "$PY" -m moe_overlap.cli verify --device cuda --out /tmp/verify_ep1 --force
  for f in report.json report.md; do [ -f /tmp/verify_ep1/$f ] && cp /tmp/verify_ep1/$f "$OUT/verify_ep1_$f"; done
  step graph 150 "$PY" benchmarks/gpu/gpu_layer.py --sections graph --graph-sync-free --shapes qwen3-30b-a3b \
    --skip-megatron --out "$OUT/gpu_layer_graph_sync_free.json"
  # what an SM margin must leave (opt-in: SECTIONS=beside; benchmarks/results/h200_2026-12-02_beside)
  step beside 500 "$PY" benchmarks/contention/gemm_beside.py --holders 2 4 8 16 --margins 24 32 48 --iters 12 \
    --shapes dsv3-proxy-ep2 deepseek-v3-ep2 qwen3-ep2 balanced-ffn14208-ep2 balanced-ffn30080-ep2 \
    --out "$OUT/gemm_beside.json"
  echo; echo "=== done ($(date -u +%FT%TZ)); files in $OUT:"; ls -la "$OUT"
}

main 2>&1 | tee "$OUT/run_single_gpu.log"
