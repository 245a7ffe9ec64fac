#!/usr/bin/env bash
# FP8 K / V pools of GQA models on CUDA (--kv_cache_dtype=fp8, runtime/cuda/README.md) in one
# device call (one GPU), each step under its own timeout and log, from the repository root:
#   1. the kernels: paged_prefill_cuda_test, rope_cache_cuda_test (FP8 cases and the 16-bit ones),
#      paged_attention_cuda_test's FP8 decode;
#   2. the engine: builds head_dim 64 / 128 fixtures with transformers
#      (tests/golden/make_golden_moe.py --only mistral_f32_hd64 qwen3_f32_hd128) and runs
#      cuda_fp8_kv_test with TANDEM_FP8_KV_FIXTURES pointing at them;
#   3. decode_step_bench: Llama-3-8B FP8 weights, a bf16 pool then an FP8 pool, batch 1 .. 256 at
#      STEP_CONTEXT (default 1024) tokens (skip with STEPS=0).
#
#   tests/gpu/fp8_kv_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh BUNDLE_DIR //kernels/attention/cuda:paged_prefill_cuda_test
#   //kernels/attention/cuda:rope_cache_cuda_test //kernels/attention/cuda:paged_attention_cuda_test
#   //runtime/cuda:cuda_fp8_kv_test tool//runtime/cuda:decode_step_bench
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
device_call_start "$@"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64" CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
step prefill 240 "$B/bin/kernels/attention/cuda/paged_prefill_cuda_test"
step rope 120 "$B/bin/kernels/attention/cuda/rope_cache_cuda_test"
step decode_fp8 180 "$B/bin/kernels/attention/cuda/paged_attention_cuda_test" --gtest_filter='*Fp8*'
FIX=$LOG/fixtures
step fixtures 300 python3 tests/golden/make_golden_moe.py --out "$FIX" \
  --only mistral_f32_hd64 qwen3_f32_hd128
step engine 400 env TANDEM_FP8_KV_FIXTURES="$FIX" "$B/bin/runtime/cuda/cuda_fp8_kv_test"
rm -rf "$FIX"/*/model.safetensors
if [[ ${STEPS:-1} != 0 ]]; then
  for kv in 0 1; do
    step "steps_fp8kv$kv" 300 "$B/bin/runtime/cuda/decode_step_bench" --shape=8b --quantization=fp8 \
      --batches=1,8,64,128,256 --context="${STEP_CONTEXT:-1024}" --steps=24 --fp8_kv=$kv
  done
fi
for f in prefill rope decode_fp8 engine; do
  echo "-- $f: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$LOG/$f.txt" | tr '\n' ' ')"
done
grep -h "make_golden" "$LOG/fixtures.txt"
grep -hE "^ *(batch|[0-9])|PARTIAL|ms" "$LOG"/steps_fp8kv*.txt 2>/dev/null | head -40
