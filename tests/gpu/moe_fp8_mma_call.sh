#!/usr/bin/env bash
# FP8 MoE experts on the tensor cores (issues 32 / 38) in one nvidia-h200 call, from the
# repository root:
#   tests/gpu/moe_fp8_mma_call.sh [BUNDLE_TAR_XZ]   (default .gpu_bundle_g5b_x/bundle.tar.xz)
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/moe:moe_fp8_cuda_test
# //runtime/cuda:cuda_moe_fp8_test //runtime/cuda:decode_step_bench, tar'd and xz'd.
# The kernel and runtime tests, then decode_step_bench alone on the GPU, old path
# (TANDEM_MOE_FP8=gemv: the CUDA-core expert GEMVs) and new (the grouped FP8 MMA) interleaved,
# bf16, and a --trace=1 kernel breakdown of one batch-64 step each. Logs under $OUT.
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/g5b_out}
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
BD=/tmp/g5b_bundle
bundle_call_start "$(realpath "${1:-.gpu_bundle_g5b_x/bundle.tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
LIMIT=${LIMIT:-140} # seconds: a bench that would end past it is skipped
export SECS=45
gpu_job test_kernel 0 "$BD/bin/kernels/moe/moe_fp8_cuda_test"
gpu_job test_runtime 0 "$BD/bin/runtime/cuda/cuda_moe_fp8_test"
wait
B="$BD/bin/runtime/cuda/decode_step_bench"
# shellcheck disable=SC2054  # the batch list is one flag
D=(--batches=1,8,64 --context=1024 --steps=32)
NAMES=()
bench() { # NAME SECONDS ENV ARGS...: one decode_step_bench process alone on the GPU, if in time
  local name=$1 secs=$2 env=$3
  shift 3
  NAMES+=("$name")
  if ((SECONDS - T0 + secs > LIMIT)); then
    echo "skip $name" > "$LOG/$name.txt"
    echo "124 0" > "$LOG/$name.rc"
    return
  fi
  SECS=$secs gpu_job "$name" 0 env "$env" "$B" "$@"
  wait
}
bench block_gemv 40 TANDEM_MOE_FP8=gemv --shape=qwen3-30b-a3b-fp8 "${D[@]}"
bench block_mma 40 TANDEM_MOE_FP8=mma --shape=qwen3-30b-a3b-fp8 "${D[@]}"
bench fp8_gemv 40 TANDEM_MOE_FP8=gemv --shape=qwen3-30b-a3b --quantization=fp8 "${D[@]}"
bench fp8_mma 40 TANDEM_MOE_FP8=mma --shape=qwen3-30b-a3b --quantization=fp8 "${D[@]}"
bench bf16 35 X=1 --shape=qwen3-30b-a3b "${D[@]}"
bench trace_block_mma 30 TANDEM_MOE_FP8=mma --shape=qwen3-30b-a3b-fp8 --batches=64 --context=1024 --steps=8 --trace=1
bench trace_block_gemv 30 TANDEM_MOE_FP8=gemv --shape=qwen3-30b-a3b-fp8 --batches=64 --context=1024 --steps=8 --trace=1
{
  device_line
  for n in test_kernel test_runtime "${NAMES[@]}"; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    echo "== $n: rc $rc in $secs s"
    grep -E "batch|^ +[0-9]+ +[0-9]+ |\[  (PASSED|FAILED|  OK) |rror|FAIL|skip|other|expert|ms" "$LOG/$n.txt" | head -n 45
  done
  echo "== total wall $((SECONDS - T0)) s"
} > "$OUT/summary.txt" 2>&1
tail -c 11000 "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
