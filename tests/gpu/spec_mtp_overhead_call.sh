#!/usr/bin/env bash
# Issue 34's cost of an attached MTP layer at acceptance 0 (runtime/engine/BENCHMARKS.md, row (c)),
# an old and a new spec_oracle_bench interleaved in one device call on one GPU (nvidia-h200), from
# the repository root:
#   tests/gpu/spec_mtp_overhead_call.sh BUNDLE_TAR_XZ [SECONDS]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh B //runtime/cuda:cuda_mtp_test
# //runtime/cuda:cuda_speculative_test //runtime/cuda:cuda_engine_test
# tool//runtime/engine:spec_oracle_bench, with the binary to compare with copied to
# B/bin/old/spec_oracle_bench (optional), tar'd and xz'd.
# Per round, for each binary (old, new; the order flips in round 2): the small DeepSeek MTP model
# of spec_bench_lib.sh's deepseek_mtp_config without its MTP layer (plain runs; the oracle at
# acceptance 0, K = 3), then with it (method mtp, K = 3, adaptive), batch 1 and 8, 256 tokens per
# request after a warm-up of WARMUP (default 24) tokens per request (spec_oracle_bench.cc:
# --warmup_tokens; 256 makes the warm-up run every shape the timed runs meet). Then the GPU
# tests at once (TEST_LIST, default cuda_mtp_test cuda_speculative_test cuda_engine_test; none
# with TESTS=0); with REAL=1 the new binary's MTP run on a real model's size, the
# deepseek-v2-lite-mtp preset (27 layers of DeepSeek-V2-Lite, device dummy weights, one MoE MTP
# layer; its plain rows are the MTP layer attached but not drafting, which cost +0.3 / -0.0% vs
# no MTP layer in the toy's eighth-slice call), REAL_SECS (default 150) at most; a second round
# while less than SECONDS (default 100) have passed. Logs under $OUT (logs.tar.gz, summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/spec_mtp_overhead_out}
SECS=${SECS:-60}
BUDGET=${2:-100}
BD=/tmp/spec_mtp_overhead_bundle
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
# shellcheck source-path=SCRIPTDIR source=../../runtime/engine/spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../runtime/engine/spec_bench_lib.sh"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
ds=$(mktemp --suffix=.json)
deepseek_mtp_config "$ds"

bench() {  # LOGNAME BINARY ARGS...: one spec_oracle_bench process (a later --dummy_config wins)
  timed_step "$1.txt" "${BENCH_SECS:-$SECS}" "$2" --backend=cuda --dummy_config="$ds" \
    --max_tokens=256 --batches=1,8 --ks=3 --warmup_tokens="${WARMUP:-24}" "${@:3}"
  echo "== $1: rc $step_rc in $step_secs s"
  grep -E "^(row|spec_oracle_bench:)" "$LOG/$1.txt"
}

real_size() {  # the new binary's MTP K = 3 on deepseek-v2-lite-mtp
  BENCH_SECS=${REAL_SECS:-150} bench real_new_mtp "$BD/bin/runtime/engine/spec_oracle_bench" \
    --speculative_method=mtp --num_speculative_tokens=3 --dummy_config=deepseek-v2-lite-mtp
}

pair() {  # ROUND NAME BINARY
  bench "r$1_$2_nomtp" "$3" --acceptances=0
  bench "r$1_$2_mtp" "$3" --speculative_method=mtp --num_speculative_tokens=3
}

round() {  # ROUND: old then new (round 2: new then old)
  local order=(old new)
  [[ $1 == 2 ]] && order=(new old)
  local which
  for which in "${order[@]}"; do
    local bin="$BD/bin/runtime/engine/spec_oracle_bench"
    [[ $which == old ]] && bin="$BD/bin/old/spec_oracle_bench"
    [[ -x $bin ]] && pair "$1" "$which" "$bin"
  done
}

tests() {  # the three GPU tests at once on the one GPU
  local t pids=()
  for t in ${TEST_LIST:-cuda_mtp_test cuda_speculative_test cuda_engine_test}; do
    timeout "$SECS" "$BD/bin/runtime/cuda/$t" > "$LOG/test_$t.txt" 2>&1 &
    pids+=($!)
  done
  for t in "${pids[@]}"; do wait "$t"; done
  for t in "$LOG"/test_*.txt; do
    echo "== $(basename "$t" .txt)"
    grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[==========\]|^compact MTP rows|^K=[0-9]" "$t"
  done
}

{
  device_line
  round 1
  [[ ${TESTS:-1} == 0 ]] || tests
  [[ ${REAL:-0} == 1 ]] && real_size
  if ((SECONDS - T0 < BUDGET)); then round 2; fi
  echo "== total wall $((SECONDS - T0)) s"
} 2>&1 | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
