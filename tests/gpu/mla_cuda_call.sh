#!/usr/bin/env bash
# Issue 33's third-slice GPU checks in one device call (nvidia-h200-x2), each step under its own
# timeout and log, from the repository root:
#   1. the MLA kernel tests (GPU 0; the bundle's run.sh): FP8 latent pools among the rest;
#   2. tests/gpu/mla_cuda_golden.sh with SHARE="" (TP=2 ranks on GPUs 0 and 1 over NCCL): the MLA
#      fixtures, TP=2, device dummy weights;
#   3. decode_step_bench --shape=deepseek-v2-lite, batch 1 / 16 / 64 at 1k context (GPU 0).
#
#   tests/gpu/mla_cuda_call.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh BUNDLE_DIR //kernels/mla:mla_tensor_core_cuda_test
#   //kernels/mla:mla_rows16_cuda_test //kernels/mla:mla_plan_cuda_test
#   //kernels/mla:mla_plain_fp8_cuda_test tool//runtime:generate
#   tool//runtime/model:make_dummy_model tool//runtime/cuda:decode_step_bench
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
device_call_start "$@"
step kernels 60 env CUDA_VISIBLE_DEVICES=0 "$B/run.sh" "$LOG/run" mla
step golden 300 env SHARE="" tests/gpu/mla_cuda_golden.sh "$B" "$LOG/golden"
step decode 150 env CUDA_VISIBLE_DEVICES=0 LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64" \
  "$B/bin/runtime/cuda/decode_step_bench" --shape=deepseek-v2-lite --batches=1,16,64 \
  --context=1024
tail -n 6 "$LOG/kernels.txt"
grep -E "PASS|FAIL|SKIP|passed|cosine" "$LOG/golden.txt"
cat "$LOG/decode.txt"
