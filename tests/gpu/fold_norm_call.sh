#!/usr/bin/env bash
# Issue 35 item 3: the residual add + RMSNorm folded into the batch-1 GEMVs
# (CudaBackendConfig::fold_norm) in ONE device call on nvidia-h200-x4 (or -x2), from the
# repository root:
#   tests/gpu/fold_norm_call.sh BUNDLE_TAR_XZ [SECONDS]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //runtime/cuda:decode_step_bench
# //runtime/cuda:cuda_engine_test //kernels/gemm/cuda:gemv_cuda_test, plus the start revision's
# decode_step_bench as DIR/bin/base/decode_step_bench, tar'd and xz'd (a 256 MiB dictionary
# keeps the two benches' shared bytes once). Jobs in parallel, each under SECONDS (default 52):
#   ab     GPU 0  decode_step_bench Llama-3-8B TP=1 --batches=1,8, one process after the other:
#                 fold 0, fold 1, the start revision's binary, fold 0, fold 1
#   golden GPU 1  cuda_engine_test's goldens (vs transformers and the CPU backend; fold on by
#                 default: the prompts run alone decode at batch 1)
#   engine GPU 2  the other cuda_engine_test tests (FoldedNormGivesTheSeparateKernelsTokensAndLogits)
#   gemv   GPU 2  gemv_cuda_test (the folded kernels vs RmsNorm + GEMV, bit for bit, and fp64)
#   ab2    GPU 3  the same A/B in the other order (fold 1, 0, 1, 0)
# With fewer than 4 GPUs (nvidia-h200-x2): no ab2, engine and gemv on GPU 1 beside golden.
# Logs under $OUT/logs; the bench rows and test results last.
set -uo pipefail
OUT=${OUT:-/tmp/fold_norm_out}
# shellcheck disable=SC2034  # gpu_job reads it
SECS=${2:-52}
BD=/tmp/fold_norm_bundle
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NEW=$BD/bin/runtime/cuda/decode_step_bench BASE=$BD/bin/base/decode_step_bench

ab_job() {  # BIN:FOLD ... one process after the other, each labelled (FOLD "-": the base binary)
  local spec bin fold args=("--batches=1,8" --steps=48 --context=1024)
  for spec in "$@"; do
    bin=${spec%%:*}
    fold=${spec#*:}
    echo "== $(basename "$(dirname "$bin")") fold_norm=$fold"
    if [[ $fold == - ]]; then "$bin" "${args[@]}"; else "$bin" "${args[@]}" "--fold_norm=$fold"; fi
  done 2>&1 | grep -vE "^(I|W|E)[0-9]{4}"
}
export -f ab_job

device_line
gpus=$(grep -c '^GPU' "$LOG/gpus.txt")
jobs=(ab golden engine gemv)
gpu_job ab 0 bash -c 'ab_job "$@"' _ "$NEW:0" "$NEW:1" "$BASE:-" "$NEW:0" "$NEW:1"
T=$BD/bin/runtime/cuda/cuda_engine_test
gpu_job golden 1 env TANDEM_REQUIRE_GPU=1 "$T" --gtest_filter='*CudaGoldenTest*'
if [[ $gpus -ge 4 ]]; then
  gpu_job ab2 3 bash -c 'ab_job "$@"' _ "$NEW:1" "$NEW:0" "$NEW:1" "$NEW:0"
  jobs+=(ab2)
fi
gpu_job engine $((gpus >= 4 ? 2 : 1)) env TANDEM_REQUIRE_GPU=1 "$T" --gtest_filter='-*CudaGoldenTest*'
gpu_job gemv $((gpus >= 4 ? 2 : 1)) env TANDEM_REQUIRE_GPU=1 "$BD/bin/kernels/gemm/cuda/gemv_cuda_test"
wait
for job in "${jobs[@]}"; do
  echo "== $job: rc $(cat "$LOG/$job.rc")"
  case $job in
    ab | ab2) grep -E "^==|^ +(1|8) |shapes," "$LOG/$job.txt" ;;
    *) grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure|Expected|seed" "$LOG/$job.txt" | head -40 ;;
  esac
done
tar czf "$OUT/logs.tar.gz" -C "$LOG" .
