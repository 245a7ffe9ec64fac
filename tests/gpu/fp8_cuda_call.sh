#!/usr/bin/env bash
# Issue 38's FP8 checks and benchmarks in one device call (nvidia-h200-x2), each step under its
# own timeout and log, from the repository root:
#   1. fp8_cuda_test, fp8_gemm_cuda_test, cuda_fp8_linear_test, fp8_cuda_bench (GPU 0; the
#      bundle's run.sh), 120 s;
#   2. decode_step_bench Llama-3-8B, batch 1 / 8 / 64, bf16 then FP8 in one process (GPU 0),
#      180 s;
#   3. tests/gpu/fp8_cuda_golden.sh (CUDA vs CPU backend; TP=2 on GPUs 0 and 1), 200 s;
#   4. kernels/fp8/scaled_mm_bench.py (torch._scaled_mm at the same GEMM shapes; GPU 0), 60 s.
#
#   tests/gpu/fp8_cuda_call.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh BUNDLE_DIR //kernels/fp8:fp8_cuda_test
#   //kernels/fp8:fp8_gemm_cuda_test //kernels/fp8:fp8_cuda_bench //runtime/cuda:cuda_fp8_linear_test
#   //runtime/cuda:decode_step_bench tool//runtime:generate
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
device_call_start "$@"
step kernels 120 env CUDA_VISIBLE_DEVICES=0 "$B/run.sh" "$LOG/run" fp8
step decode 180 env CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64" \
  "$B/bin/runtime/cuda/decode_step_bench" --batches=1,8,64 --quantization=none,fp8
step golden 200 tests/gpu/fp8_cuda_golden.sh "$B" "$LOG/golden"
step scaled_mm 60 env CUDA_VISIBLE_DEVICES=0 python3 kernels/fp8/scaled_mm_bench.py
tail -n 4 "$LOG/kernels.txt"
grep -E "PASS|FAIL|SKIP|passed" "$LOG/golden.txt"
cat "$LOG/decode.txt"
