#!/usr/bin/env bash
# Block-FP8 activation scales written group-major (no transpose before the block GEMM; issue 38's
# block-scaled target) in one device call on nvidia-h200, from the repository root:
#   kernels/fp8/fp8_group_major_call.sh BUNDLE_TAR_XZ [tests|bench|all]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //runtime/cuda:cuda_engine_fold_test
# //runtime/cuda:cuda_fp8_linear_test //runtime/cuda:cuda_mla_fp8_dummy_test
# tool//runtime/cuda:decode_step_bench tool//kernels/fp8/cutlass:cutlass_block_gemm_bench
# tool//runtime:generate, tarred and xz-compressed. Steps, each under its own timeout:
#   tests: cuda_fp8_linear_test (seeds 1, 2), cuda_engine_fold_test's FP8 cases (the fused group
#          codes equal the separate pass bit for bit), cuda_mla_fp8_dummy_test, and
#          tests/gpu/fp8_cuda_golden.sh on the block-FP8 formats (fp8_block, fp8_deepseek_v3,
#          ct_moe_block_dynamic: CUDA against the CPU backend);
#   bench: cutlass_block_gemm_bench (M = 2048 / 8192: per-tensor interleaved with CUTLASS), then
#          decode_step_bench's traced prefill of DeepSeek-V3-4l-FP8 (4 x 2048 tokens) with
#          TANDEM_FP8_GROUP_MAJOR=0 (the transpose before each block GEMM) and with the default
#          (none), twice each, alternating.
# Logs under $OUT (logs.tgz); a summary at the end of the output.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/fp8_group_major_out}
LOG=$OUT/logs
mkdir -p "$LOG"
TARBALL=$(realpath "${1:?bundle .tar.xz}")
WHAT=${2:-all}
BD=/tmp/fp8_gm_bundle
if [[ ! -d $BD/bin ]]; then
  mkdir -p "$BD" && tar xJf "$TARBALL" -C "$BD" --strip-components=1 || { echo "FAIL extract"; exit 1; }
fi
echo "extracted in $((SECONDS - T0)) s"
nvidia-smi > "$LOG/gpu.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
export NCCL_NVLS_ENABLE=0
SUMMARY=()
gtest() { # NAME TIMEOUT BINARY [ARGS...]: a gtest binary's verdict line into the summary
  local name=$1 to=$2
  shift 2
  timeout "$to" "$@" > "$LOG/$name.txt" 2>&1
  local rc=$?
  SUMMARY+=("$name rc=$rc $(grep -E '^\[  (PASSED|FAILED)  \]' "$LOG/$name.txt" | tr '\n' ' ')")
}
if [[ $WHAT == tests || $WHAT == all ]]; then
  for s in 1 2; do
    TANDEM_TEST_SEED=$s gtest "fp8_linear_seed$s" 120 "$BD/bin/runtime/cuda/cuda_fp8_linear_test"
  done
  gtest fold_fp8 240 "$BD/bin/runtime/cuda/cuda_engine_fold_test" --gtest_filter='*Fp8*'
  gtest mla_fp8_dummy 240 "$BD/bin/runtime/cuda/cuda_mla_fp8_dummy_test"
  ONLY='^(fp8_block|fp8_deepseek_v3|ct_moe_block_dynamic)$' timeout 300 \
    tests/gpu/fp8_cuda_golden.sh "$BD" "$LOG/golden" > "$LOG/golden.txt" 2>&1
  SUMMARY+=("fp8_cuda_golden (block formats) rc=$? $(tail -1 "$LOG/golden.txt")")
fi
if [[ $WHAT == bench || $WHAT == all ]]; then
  timeout 240 "$BD/bin/kernels/fp8/cutlass/cutlass_block_gemm_bench" --iters=20 --ms=2048,8192 \
    > "$LOG/cutlass_bench.txt" 2>&1
  SUMMARY+=("cutlass_block_gemm_bench rc=$? $(tail -1 "$LOG/cutlass_bench.txt")")
  for round in 1 2; do
    for gm in 0 1; do
      TANDEM_FP8_GROUP_MAJOR=$gm timeout 150 "$BD/bin/runtime/cuda/decode_step_bench" \
        --shape=deepseek-v3-4l-fp8 --batches=4 --context=2048 --steps=8 --trace=1 \
        --prefill_trace=1 > "$LOG/prefill_gm${gm}_r$round.txt" 2>&1
      SUMMARY+=("prefill group_major=$gm round $round rc=$? $(grep -m1 'first step' "$LOG/prefill_gm${gm}_r$round.txt")")
    done
  done
fi
printf '%s\n' "${SUMMARY[@]}"
echo "total $((SECONDS - T0)) s"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
