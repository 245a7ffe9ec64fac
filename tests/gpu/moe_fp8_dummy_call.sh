#!/usr/bin/env bash
# Device dummy FP8 experts (issues 32 / 38), the compressed-tensors FP8_BLOCK MoE fixture's CUDA
# row and FP8 latent KV under --dp_attention (issue 33) in one device call on nvidia-h200 (one
# GPU), from the repository root:
#   tests/gpu/moe_fp8_dummy_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //runtime/cuda:cuda_moe_fp8_dummy_test
# //runtime/cuda:decode_step_bench tool//runtime:generate, tar'd and xz'd.
# First, side by side on the GPU (small models; generate's KV pool is 256 MiB):
#   dummy_test  cuda_moe_fp8_dummy_test (device draw vs the host's, the layer vs the CPU)
#   golden      fp8_cuda_golden.sh ONLY=ct_moe_block_dynamic|tiny-moe-dummy-fp8 (TP=2 sharing
#               the GPU)
#   dp          mla_fp8_cuda_golden.sh PARTS=dp (--tp=2 --enable_expert_parallel --dp_attention
#               --kv_cache_dtype=fp8 sharing the GPU)
# then alone (the whole GPU's memory):
#   bench_bf16  decode_step_bench --shape=qwen3-30b-a3b --batches=1,8,64 --context=256 --steps=32
#   bench_fp8   the same with --quantization=fp8 (device dummy per-channel FP8, per-token
#               activations: experts and attention projections)
#   bench_block --shape=qwen3-30b-a3b-fp8 (1 x 128 weight groups, 1 x 128 activations)
# Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_fp8_dummy_out}
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
BD=/tmp/moe_fp8_dummy_bundle
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

export SECS=50
gpu_job dummy_test 0 "$BD/bin/runtime/cuda/cuda_moe_fp8_dummy_test"
gpu_job golden 0 env SHARE=--tp_share_device ONLY='^(ct_moe_block_dynamic|tiny-moe-dummy-fp8)$' \
  tests/gpu/fp8_cuda_golden.sh "$BD" "$LOG/golden"
gpu_job dp 0 env PARTS=dp tests/gpu/mla_fp8_cuda_golden.sh "$BD" "$LOG/dp"
wait
# shellcheck disable=SC2054  # the batch list is one flag
D=(--batches=1,8,64 --context=256 --steps=32)
bench() { # NAME SECONDS ARGS...: one decode_step_bench process alone on the GPU
  SECS=$2 gpu_job "$1" 0 "$BD/bin/runtime/cuda/decode_step_bench" "${@:3}" "${D[@]}"
  wait
}
bench bench_bf16 35 --shape=qwen3-30b-a3b
bench bench_fp8 40 --shape=qwen3-30b-a3b --quantization=fp8
bench bench_block 40 --shape=qwen3-30b-a3b-fp8

{
  device_line
  for n in dummy_test golden dp bench_bf16 bench_fp8 bench_block; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    echo "== $n: rc $rc in $secs s"
    grep -E "^(PASS|FAIL|SKIP)|passed|failures|rel\. L2|codes \(|tp |batch|^ +[0-9]+ +[0-9]+ |\[  (PASSED|FAILED|  OK) |rror" \
      "$LOG/$n.txt" | head -n 40
  done
  echo "== total wall $((SECONDS - T0)) s"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
