#!/usr/bin/env bash
# Issue 31, the 8B TP=4 batch-1 decode step, in ONE device call on nvidia-h200-x4, most important
# first, each section skipped once DEADLINE seconds have passed:
#   1. correctness: custom_all_reduce_gpu_test (2 and 4 ranks: the fused all-reduce + add +
#      RMSNorm bit-identical to the all-reduce + norm, graph replays) and gemv_cuda_test
#      (the GEMV's predicated tail), side by side (no timing);
#   2. decode_step_bench Llama-3-8B TP=4, batches 1/8/64: the custom all-reduce without PDL and
#      unfused (the previous default), with PDL unfused, with PDL fused (--fused_norm=1);
#   3. the same with --trace=1 at batch 1 (rank 0's kernels per class through CUPTI);
#   4. Llama-3-70B TP=4 unfused / fused;
#   5. TP=2 unfused / fused, 8B on GPUs 0-1 and 70B on GPUs 2-3 at the same time.
#
#   DEADLINE=100 tests/gpu/tp_fused_norm_call.sh BUNDLE_DIR LOG_DIR
# BUNDLE_DIR: tests/gpu/bundle.sh with //comm:custom_all_reduce_gpu_test
# //kernels/gemm/cuda:gemv_cuda_test //runtime/cuda:decode_step_bench, plus libcupti.so.13 in lib/.
set -uo pipefail
B=$(cd "${1:?bundle}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEADLINE=${DEADLINE:-100}
T0=$(date +%s)
D=$B/bin/runtime/cuda/decode_step_bench
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
section() {
  echo "== $(($(date +%s) - T0)) s: $*"
  [[ $(left) -gt 8 ]] || { echo "   skipped: past the deadline"; return 1; }
}
bench() {
  local t
  t=$(left)
  ((t > 45)) && t=45
  echo "-- decode_step_bench $*"
  timeout "$t" "$D" --steps=24 --batches=1,8,64 "$@" 2>&1 | grep -vE "^(I|W|E)[0-9]{4}"
}

if section "tests"; then
  TANDEM_REQUIRE_GPU=1 timeout 80 "$B/bin/comm/custom_all_reduce_gpu_test" >"$LOG/car.log" 2>&1 &
  car=$!
  CUDA_VISIBLE_DEVICES=3 TANDEM_REQUIRE_GPU=1 timeout 80 \
    "$B/bin/kernels/gemm/cuda/gemv_cuda_test" >"$LOG/gemv.log" 2>&1 &
  gemv=$!
  wait $car
  echo "custom_all_reduce_gpu_test rc=$?"
  grep -E "OK \]|FAILED|rank [0-9]:" "$LOG/car.log" | head -20
  wait $gemv
  echo "gemv_cuda_test rc=$?"
  grep -E "OK \]|FAILED|Failure" "$LOG/gemv.log" | head -10
fi
if section "8B TP=4"; then
  bench --tp=4 --ar_pdl=0 --fused_norm=0
  bench --tp=4 --fused_norm=0
  bench --tp=4 --fused_norm=1
fi
section "8B TP=4 traced" && bench --tp=4 --fused_norm=1 --trace=1 --batches=1
if section "70B TP=4"; then
  bench --shape=70b --tp=4 --fused_norm=0
  bench --shape=70b --tp=4 --fused_norm=1
fi
if section "TP=2 (8B on GPUs 0-1, 70B on GPUs 2-3)"; then
  (
    export CUDA_VISIBLE_DEVICES=0,1
    bench --tp=2 --fused_norm=0
    bench --tp=2 --fused_norm=1
  ) >"$LOG/tp2_8b.txt" 2>&1 &
  (
    export CUDA_VISIBLE_DEVICES=2,3
    bench --shape=70b --tp=2 --fused_norm=0
    bench --shape=70b --tp=2 --fused_norm=1
  ) >"$LOG/tp2_70b.txt" 2>&1 &
  wait
  cat "$LOG/tp2_8b.txt" "$LOG/tp2_70b.txt"
fi
echo "== $(($(date +%s) - T0)) s: done"
