#!/usr/bin/env bash
# Issue 34's benchmark table in one device call on nvidia-h200-x4 (4 GPUs), from the repository
# root:
#   [PART=oracle] tests/gpu/spec_oracle_call.sh BUNDLE_TAR_XZ [SECONDS_PER_JOB]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh .. //runtime/cuda:cuda_engine_test
# //runtime/cuda:cuda_speculative_test //runtime/cuda:cuda_mtp_test
# //kernels/sampling/cuda:rejection_cuda_test //kernels/sampling/cuda:sampling_cuda_test
# tool//runtime/engine:spec_oracle_bench, tar'd and xz'd. Every bench row is a
# spec_oracle_bench run (runtime/engine/spec_oracle_bench.cc: one model load, a warm-up that
# captures every graph, then timed runs of 256 tokens per request, random 64-token prompts,
# greedy, bf16, dummy weights drawn on the device, CUDA graphs for decode and verify steps).
# Jobs in parallel, each under a timeout:
#   oracle1  GPU 0  the oracle drafter (right by construction, corrupted to acceptance 1 / 0.7 /
#                   0.5 / 0), K = 1..6, batch 1, Llama-3-8B; then n-gram (adaptive, K = 3) at
#                   batch 1 / 8 / 32 on the 8B shape with a 64-token vocabulary
#   oracle8  GPU 1  the same oracle table at batch 8; then n-gram with a fixed K = 3
#   drafts   GPU 2  the draft model = a copy of the target (same config and seed), K = 1..6, batch
#                   1; a random Llama-3.2-1B-shape draft (acceptance 0), K = 3 adaptive, batch 1
#                   and 8; DeepSeek MTP (deepseek_mtp_config), K = 1 and 3, batch 1 and 8, and
#                   the same model without MTP (plain, and the oracle at acceptance 0, K = 3)
#   tests    GPU 3  cuda_engine_test, cuda_speculative_test, rejection_cuda_test, cuda_mtp_test,
#                   sampling_cuda_test (five processes at once)
# PART=oracle: only the oracle table (every acceptance incl. 0, calibration as the bench's default),
# K = 1..3 and 4..6 at batch 1 and 8 on the four GPUs (a bundle of spec_oracle_bench suffices).
# Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/spec_oracle_out}
SECS=${2:-90}
BD=/tmp/spec_oracle_bundle
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
# shellcheck source-path=SCRIPTDIR source=../../runtime/engine/spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../runtime/engine/spec_bench_lib.sh"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
bench="$BD/bin/runtime/engine/spec_oracle_bench"
v64=$(mktemp --suffix=.json) c1b=$(mktemp --suffix=.json) ds=$(mktemp --suffix=.json)
llama8b_v64_config "$v64"
llama1b_config "$c1b"
deepseek_mtp_config "$ds"

run() {  # NAME ARGS...: one spec_oracle_bench process
  echo "== $1"
  "$bench" --backend=cuda --max_tokens=256 --calibration_rounds=1 --acceptances=1,0.7,0.5 \
    "${@:2}" 2>&1
}

oracle_job() {  # BATCH NGRAM_ADAPTIVE
  run "oracle batch $1" --batches="$1" --ks=1,2,3,4,5,6
  run "ngram adaptive=$2" --dummy_config="$v64" --prompt_vocab=64 --batches=1,8,32 --ks=3 \
    --speculative_method=ngram --num_speculative_tokens=3 --speculative_adaptive="$2"
}

drafts_job() {
  run "draft = target" --batches=1 --ks=1,2,3,4,5,6 --speculative_method=draft \
    --num_speculative_tokens=6 --speculative_adaptive=false --draft_model=dummy:llama3-8b:0
  run "draft 1b" --batches=1,8 --ks=3 --speculative_method=draft --num_speculative_tokens=3 \
    --draft_model="dummy:$c1b:1"
  # The MTP model without its layer (plain rows with no hidden states kept), and the oracle's
  # acceptance-0 verify cost on it; then MTP itself.
  run "mtp model, oracle" --dummy_config="$ds" --batches=1,8 --ks=3 --acceptances=0
  run "mtp" --dummy_config="$ds" --batches=1,8 --ks=1,3 --speculative_method=mtp \
    --num_speculative_tokens=3
}

tests_job() {  # five test processes on one GPU; fails when any does
  local rc=0 t pids=()
  for t in runtime/cuda/cuda_engine_test runtime/cuda/cuda_speculative_test \
    runtime/cuda/cuda_mtp_test kernels/sampling/cuda/rejection_cuda_test \
    kernels/sampling/cuda/sampling_cuda_test; do
    "$BD/bin/$t" > "$LOG/test_${t##*/}.txt" 2>&1 &
    pids+=($!)
  done
  for t in "${pids[@]}"; do wait "$t" || rc=1; done
  for t in "$LOG"/test_*.txt; do
    echo "== $(basename "$t" .txt)"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]" "$t"
  done
  return $rc
}

if [[ ${PART:-all} == oracle ]]; then  # the oracle table alone: K = 1..3 / 4..6 x batch 1 / 8
  gpu_job oracle1a 0 "$bench" --backend=cuda --max_tokens=256 --batches=1 --ks=1,2,3
  gpu_job oracle1b 1 "$bench" --backend=cuda --max_tokens=256 --batches=1 --ks=4,5,6
  gpu_job oracle8a 2 "$bench" --backend=cuda --max_tokens=256 --batches=8 --ks=1,2,3
  gpu_job oracle8b 3 "$bench" --backend=cuda --max_tokens=256 --batches=8 --ks=4,5,6
  wait
  {
    device_line
    for n in oracle1a oracle1b oracle8a oracle8b; do
      read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
      echo "== $n: rc $rc in $secs s"
      grep -E "^(row|spec_oracle_bench:)" "$LOG/$n.txt"
    done
  } | tee "$OUT/summary.txt"
  tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
  exit 0
fi
gpu_job oracle1 0 bash -c "$(declare -f run oracle_job); bench=$bench v64=$v64; oracle_job 1 true"
gpu_job oracle8 1 bash -c "$(declare -f run oracle_job); bench=$bench v64=$v64; oracle_job 8 false"
gpu_job drafts 2 bash -c "$(declare -f run drafts_job); bench=$bench c1b=$c1b ds=$ds; drafts_job"
gpu_job tests 3 bash -c "$(declare -f tests_job); BD=$BD LOG=$LOG; tests_job"
wait

{
  device_line
  for n in oracle1 oracle8 drafts tests; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    echo "== $n: rc $rc in $secs s"
    grep -E "^(==|row|spec_oracle_bench:)|\[  (PASSED|FAILED) " "$LOG/$n.txt" | head -n 120
  done
  echo "== total wall $((SECONDS - T0)) s"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
