#!/usr/bin/env bash
# Issue 32's MoE kernel follow-ups on one GPU, old against new in one device call:
#   1. moe_cuda_test and moe_cuda_layer_test (every kernel against the CPU reference,
#      MoeGroupedMma and MoeCombineSplit included);
#   2. moe_cuda_bench (old | new columns, mma_err / cdiff checks at the real shapes); if it
#      fails, moe_cuda_bench --new=0 (the old kernels alone);
#   3. decode_step_bench for the Qwen3-30B-A3B and Mixtral-8x7B shapes with
#      TANDEM_MOE_KERNELS=old, then =new (runtime/cuda/cuda_moe_mlp.h: CudaMoeKernels).
#
#   tests/gpu/moe_kernels_ab.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //kernels/moe:moe_cuda_test //kernels/moe:moe_cuda_layer_test
#   //kernels/moe:moe_cuda_bench //runtime/cuda:decode_step_bench. GPU: $CUDA_VISIBLE_DEVICES,
# default 0. Each step has its own timeout and its log in LOG_DIR (8 files at most); the summary
# (rc and the last lines of each) goes to stdout.
set -uo pipefail
[[ $# -eq 2 ]] || {
  echo "usage: $0 BUNDLE_DIR LOG_DIR" >&2
  exit 2
}
B=$(cd "$1" && pwd)
LOG=$2
mkdir -p "$LOG"
# As the bundle's run.sh: its libraries, then the machine's CUDA 13 ones (cuBLAS, NCCL); a test
# without a GPU fails instead of skipping.
export LD_LIBRARY_PATH="$B/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TANDEM_REQUIRE_GPU=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0} NCCL_NVLS_ENABLE=0
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"

# step NAME SECONDS KERNELS COMMAND...: runs COMMAND with TANDEM_MOE_KERNELS=KERNELS.
step() {
  local name=$1 limit=$2 kernels=$3
  shift 3
  TANDEM_MOE_KERNELS=$kernels timed_step "$name.log" "$limit" "$@"
  echo "== $name (TANDEM_MOE_KERNELS=$kernels): rc=$step_rc, $step_secs s"
  tail -n 8 "$LOG/$name.log"
  return "$step_rc"
}

step moe_cuda_test 90 old "$B/bin/kernels/moe/moe_cuda_test"
step moe_cuda_layer_test 90 old "$B/bin/kernels/moe/moe_cuda_layer_test"
if ! step bench 150 old "$B/bin/kernels/moe/moe_cuda_bench" --iters=10; then
  step bench_old 120 old "$B/bin/kernels/moe/moe_cuda_bench" --iters=10 --new=0
fi
for kernels in old new; do
  step "decode_qwen3_$kernels" 120 "$kernels" "$B/bin/runtime/cuda/decode_step_bench" \
    --shape=qwen3-30b-a3b --batches=1,8,64 --context=1024 --steps=32
done
for kernels in old new; do
  step "decode_mixtral_$kernels" 150 "$kernels" "$B/bin/runtime/cuda/decode_step_bench" \
    --shape=mixtral-8x7b --batches=1,8 --context=1024 --steps=32
done
