#!/usr/bin/env bash
# FP8 MoE experts and DeepSeek's FP8 MLA projections on CUDA (issues 38 / 32) in one device call
# on nvidia-h200-x4 (4 GPUs), from the repository root:
#   tests/gpu/moe_fp8_call.sh BUNDLE_TAR_XZ [SECONDS]
# Extracts BUNDLE_TAR_XZ (tests/gpu/bundle.sh .. //kernels/moe:moe_fp8_cuda_test
# //runtime/cuda:cuda_moe_fp8_test //kernels/moe:moe_fp8_cuda_bench //kernels/moe:moe_cuda_test
# tool//runtime:generate tool//runtime/model:make_dummy_model), then runs
# in parallel, each GPU's chain under one timeout of SECONDS (default 50):
#   GPU 3  moe_fp8_cuda_test, cuda_moe_fp8_test (the per-expert FP8 GEMM prefill path),
#          moe_fp8_cuda_bench (FP8 vs bf16 expert GEMVs), moe_cuda_test
#   GPU 0  fp8_cuda_golden.sh ONLY=ct_moe_channel_dynamic(-ep) (TP=1, TP=2, TP=2 EP (a) sharing
#          the GPU), then moe_cuda_golden.sh (the bf16 MoE models through the changed upload)
#   GPU 1  fp8_cuda_golden.sh ONLY=ct_moe_channel_dynamic_pkg(-ep)
#   GPU 2  fp8_cuda_golden.sh ONLY=fp8_deepseek_v3(-ep), then mla_cuda_golden.sh (bf16 MLA)
# Logs under $OUT (logs.tar.gz + summary.txt); prints a PASS / FAIL line per chain.
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_fp8_out} SECS=${2:-50}
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
BD=/tmp/moe_fp8_bundle
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"

chain() { # NAME GPU CMDS: a bash command string on one GPU under one timeout (gpu_job)
  gpu_job "$1" "$2" bash -c "$3"
}
K=$BD/bin/kernels/moe
chain kernels 3 "'$K/moe_fp8_cuda_test' && '$BD/bin/runtime/cuda/cuda_moe_fp8_test' &&
  '$K/moe_fp8_cuda_bench' --iters=20 && '$K/moe_cuda_test'"
golden() {  # FIXTURE: the FP8 check of one fixture at TP=1 / 2 / EP, sharing the GPU
  echo "SHARE=--tp_share_device ONLY='^$1(-ep)?\$' tests/gpu/fp8_cuda_golden.sh '$BD' '$LOG/$1'"
}
chain ct_moe 0 "$(golden ct_moe_channel_dynamic) && tests/gpu/moe_cuda_golden.sh '$BD' '$LOG/moe16'"
chain ct_moe_pkg 1 "$(golden ct_moe_channel_dynamic_pkg)"
chain deepseek 2 "$(golden fp8_deepseek_v3) && tests/gpu/mla_cuda_golden.sh '$BD' '$LOG/mla16'"
wait

{
  echo "== device: $(head -n 1 "$LOG/gpus.txt") ($(grep -c '^GPU' "$LOG/gpus.txt") GPUs)"
  fails=0
  for n in kernels ct_moe ct_moe_pkg deepseek; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    verdict=PASS
    [[ $rc == 0 ]] || { verdict=FAIL; fails=$((fails + 1)); }
    if grep -q "no GPU: skipped\|\[  SKIPPED \]" "$LOG/$n.txt"; then verdict=SKIP; fi
    echo "== $n: $verdict (rc $rc in $secs s)"
    grep -E "^(PASS|FAIL|SKIP)|passed|cosine|speedup|\[  (PASSED|FAILED|  OK) " "$LOG/$n.txt" |
      head -n 40
  done
  echo "== total wall $((SECONDS - T0)) s; $fails of 4 chains failed"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
