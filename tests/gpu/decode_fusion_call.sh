#!/usr/bin/env bash
# Issues 31 / 35 (H1): the dense batch-1 decode step's GEMV variants and the host time between
# steps, in ONE device call on nvidia-h200-x4, each section skipped once DEADLINE seconds passed:
#   1. correctness, one GPU each, side by side: gemv_cuda_test (split-k, early weight loads),
#      gemv_rope_cuda_test (qkv GEMV + RoPE + KV write vs CPU and the unfused pair),
#      cuda_engine_test's goldens + MidConfig tests with TANDEM_TEST_DECODE=fused and without;
#   2. decode_step_bench Llama-3-8B TP=4 batch 1, every --gemv variant in one process (same call:
#      base first; split-k while under 4096 warps), then base / split / all at 16384 warps;
#   3. the same traced (--trace=1 --trace_host=1): kernel classes and the GPU's idle time between
#      steps split by host calls and copies, base and all levers;
#   4. Llama-3-70B TP=4 batch 1, base vs the levers;
#   5. 8B TP=2 (GPUs 0-1) and 8B TP=1 (GPU 2) at the same time.
#
#   DEADLINE=170 tests/gpu/decode_fusion_call.sh BUNDLE_DIR LOG_DIR
# BUNDLE_DIR: tests/gpu/bundle.sh with //kernels/gemm/cuda:gemv_cuda_test
# //kernels/gemm/cuda:gemv_rope_cuda_test //runtime/cuda:cuda_engine_test
# //runtime/cuda:decode_step_bench (libcupti from the device's CUDA installation).
set -uo pipefail
B=$(cd "${1:?bundle}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
CUPTI=$(dirname "$(find /usr/local/cuda/ /usr/local/cuda-13*/ -name 'libcupti.so*' 2>/dev/null |
  head -1)")
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:$CUPTI:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
DEADLINE=${DEADLINE:-170}
T0=$(date +%s)
D=$B/bin/runtime/cuda/decode_step_bench
ALL=base,early,split,early+split,rope,early+split+rope
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
section() {
  echo "== $(($(date +%s) - T0)) s: $*"
  [[ $(left) -gt 8 ]] || {
    echo "   skipped: past the deadline"
    return 1
  }
}
bench() {
  local t
  t=$(left)
  ((t > 60)) && t=60
  echo "-- decode_step_bench $*"
  timeout "$t" "$D" --steps=64 --batches=1 "$@" 2>&1 | grep -vE "^(I|W|E)[0-9]{4}"
}
gtest() {  # GPU NAME [VAR=VALUE ...] BINARY [ARGS ...], in the background
  local gpu=$1 name=$2
  shift 2
  (
    env CUDA_VISIBLE_DEVICES="$gpu" TANDEM_REQUIRE_GPU=1 timeout 70 env "$@" >"$LOG/$name.log" 2>&1
    echo "$name rc=$?" >>"$LOG/$name.log"
  ) &
}

if section "tests"; then
  gtest 0 gemv "$B/bin/kernels/gemm/cuda/gemv_cuda_test"
  gtest 1 gemv_rope "$B/bin/kernels/gemm/cuda/gemv_rope_cuda_test"
  E=$B/bin/runtime/cuda/cuda_engine_test
  F=--gtest_filter=*Golden*:*GraphAndEager*:*HeadDim128*:*GroupOfOne*
  gtest 2 engine_fused TANDEM_TEST_DECODE=fused TANDEM_FIXTURES="$PWD/tests/golden/fixtures" \
    "$E" "$F"
  gtest 3 engine_plain TANDEM_FIXTURES="$PWD/tests/golden/fixtures" "$E" "$F"
  wait
  for n in gemv gemv_rope engine_fused engine_plain; do
    grep -E "OK \]|FAILED|Failure|rc=|values_differing" "$LOG/$n.log" | head -30
  done
fi
if section "8B TP=4"; then
  bench --tp=4 --gemv=$ALL
  bench --tp=4 --gemv=base,split,early+split+rope --gemv_split_warps=16384
fi
section "8B TP=4 traced" && bench --tp=4 --trace=1 --trace_host=1 --gemv=base,early+split+rope
section "70B TP=4" && bench --shape=70b --tp=4 --gemv=base,early+split+rope,early+rope
if section "8B TP=2 (GPUs 0-1) and TP=1 (GPU 2)"; then
  CUDA_VISIBLE_DEVICES=0,1 bench --tp=2 --gemv=$ALL >"$LOG/tp2.txt" 2>&1 &
  CUDA_VISIBLE_DEVICES=2 bench --gemv=$ALL >"$LOG/tp1.txt" 2>&1 &
  wait
  cat "$LOG/tp2.txt" "$LOG/tp1.txt"
fi
echo "== $(($(date +%s) - T0)) s: done"
