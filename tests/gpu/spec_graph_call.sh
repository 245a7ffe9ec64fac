#!/usr/bin/env bash
# Issue 34's CUDA verify graphs and device rejection sampling, in one device call on
# nvidia-h200-x4 (4 GPUs), from the repository root:
#   tests/gpu/spec_graph_call.sh BUNDLE_TAR_XZ [SECONDS_PER_JOB]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh .. //runtime/cuda:cuda_speculative_test
# //runtime/cuda:cuda_mtp_test //kernels/sampling/cuda:rejection_cuda_test tool//runtime:generate
# tool//runtime/model:make_dummy_model, tar'd and xz'd. Jobs in parallel, each under a timeout:
#   tests   GPU 0  rejection_cuda_test, cuda_speculative_test (graphed verify = eager padded),
#                  then MTP K = 1 / 3 vs off on a random DeepSeek-V3 model (V2-Lite attention:
#                  16 heads, latent 512 + 64, hidden 2048; 2 dense layers, 32000 ids, one MTP
#                  layer: the MTP's dummy weights are drawn on the host, so a larger one would
#                  not fit the call), graphed vs eager verify, batch 1 and 8
#   mtp     GPU 1  tests/gpu/mtp_cuda_golden.sh (cuda_mtp_test and the MTP goldens)
#   ngram   GPU 2  Llama-3-8B shape, 64-token vocabulary (greedy loops: acceptance ~1%), n-gram
#                  K = 4 vs off at batch 1 and 8: verify passes graphed vs eager
#   draft   GPU 3  Llama-3-8B target + a random Llama-3.2-1B-shape draft (acceptance 0), K = 4
#                  vs off at batch 1 and 8, graphed vs eager verify
# Logs under $OUT (logs.tar.gz + summary.txt); "== JOB: PASS|FAIL" lines and the bench lines.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/spec_graph_out}
SECS=${2:-68}
BD=/tmp/spec_graph_bundle
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
# shellcheck source-path=SCRIPTDIR source=../../runtime/engine/spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../runtime/engine/spec_bench_lib.sh"
gpu_generate "$BD"
LIB="$BD/lib:/usr/local/cuda/lib64"

bench() {  # NAME ARGS...: one generate run, its speculative line
  local name=$1 line
  shift
  line=$("$gen" --backend=cuda --load_format=dummy --ignore_eos "$@" 2>&1 > /dev/null | tail -1)
  echo "bench $name: $line"
}

tests_job() {  # three processes on one GPU; fails when any does
  local t=$BD/bin/runtime/cuda/cuda_speculative_test rc=0
  env LD_LIBRARY_PATH="$LIB" "$BD/bin/kernels/sampling/cuda/rejection_cuda_test" > "$1.a" 2>&1 &
  env LD_LIBRARY_PATH="$LIB" "$t" --gtest_filter='*Diverges*' > "$1.b" 2>&1 &
  env LD_LIBRARY_PATH="$LIB" "$t" --gtest_filter='*Graphed*:*Draft*' > "$1.c" 2>&1 &
  for _ in 1 2 3; do wait -n || rc=1; done
  cat "$1.a" "$1.b" "$1.c"
  return $rc
}

ngram_job() {
  local v64 p1 p8
  v64=$(mktemp --suffix=.json)
  llama8b_v64_config "$v64"
  p1=$(prompts loop 1 64)
  p8=$(prompts loop 8 64)
  for b in 1 8; do
    local p=$p1
    [[ $b == 1 ]] || p=$p8
    local base=(--dummy_config="$v64" --prompt_ids="$p" --max_tokens=256)
    local spec=(--speculative_method=ngram --num_speculative_tokens=4)
    bench "ngram b=$b off" "${base[@]}"
    bench "ngram b=$b K=4 graphs" "${base[@]}" "${spec[@]}"
    bench "ngram b=$b K=4 eager" "${base[@]}" "${spec[@]}" --cuda_verify_graphs=false
    bench "ngram b=$b K=4 fixed graphs" "${base[@]}" "${spec[@]}" --speculative_adaptive=false
    bench "ngram b=$b K=4 fixed eager" "${base[@]}" "${spec[@]}" --speculative_adaptive=false \
      --cuda_verify_graphs=false
  done
}

draft_job() {
  local c1b p1 p8
  c1b=$(mktemp --suffix=.json)
  llama1b_config "$c1b"
  p1=$(prompts random 1 30000)
  p8=$(prompts random 8 30000)
  for b in 1 8; do
    local p=$p1
    [[ $b == 1 ]] || p=$p8
    local base=(--dummy_config=llama3-8b --kv_cache_bytes=$((4 << 30)) --prompt_ids="$p"
      --max_tokens=128)
    local spec=(--speculative_method=draft --num_speculative_tokens=4
      --draft_model="dummy:$c1b:1")
    bench "draft b=$b off" "${base[@]}"
    bench "draft b=$b K=4 graphs" "${base[@]}" "${spec[@]}"
    bench "draft b=$b K=4 eager" "${base[@]}" "${spec[@]}" --cuda_verify_graphs=false
  done
}

mtp_job() {
  local ds p1 p8
  ds=$(mktemp --suffix=.json)
  p1=$(prompts random 1 30000)
  p8=$(prompts random 8 30000)
  deepseek_mtp_config "$ds"
  for b in 1 8; do
    local p=$p1
    [[ $b == 1 ]] || p=$p8
    local base=(--dummy_config="$ds" --prompt_ids="$p" --max_tokens=128)
    bench "mtp b=$b off" "${base[@]}"
    for k in 1 3; do
      bench "mtp b=$b K=$k graphs" "${base[@]}" --speculative_method=mtp \
        --num_speculative_tokens=$k
    done
    bench "mtp b=$b K=3 eager" "${base[@]}" --speculative_method=mtp --num_speculative_tokens=3 \
      --cuda_verify_graphs=false
  done
}

gpu_job tests 0 bash -c "source runtime/engine/spec_bench_lib.sh; gen=$gen; BD=$BD LIB=$LIB; \
  $(declare -f tests_job bench mtp_job); tests_job $LOG/tests_part && mtp_job"
gpu_job mtp 1 tests/gpu/mtp_cuda_golden.sh "$BD" "$LOG/mtp_golden"
gpu_job ngram 2 bash -c "source runtime/engine/spec_bench_lib.sh; gen=$gen; $(declare -f bench ngram_job); ngram_job"
gpu_job draft 3 bash -c "source runtime/engine/spec_bench_lib.sh; gen=$gen; $(declare -f bench draft_job); draft_job"
wait

{
  device_line
  for n in tests mtp ngram draft; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    verdict=PASS
    [[ $rc == 0 ]] || verdict=FAIL
    if grep -q "no GPU: skipped\|\[  SKIPPED \]" "$LOG/$n.txt"; then verdict=SKIP; fi
    echo "== $n: $verdict (rc $rc in $secs s)"
    grep -E "^(PASS|FAIL|SKIP|bench|K=|plain|target|MTP)|passed|mismatches|\[  (PASSED|FAILED) " \
      "$LOG/$n.txt" | head -n 60
  done
  echo "== total wall $((SECONDS - T0)) s"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
