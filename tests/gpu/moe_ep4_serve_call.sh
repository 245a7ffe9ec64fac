#!/usr/bin/env bash
# Issue 32 in one device call on nvidia-h200-x4 (4 GPUs), from the repository root:
#   tests/gpu/moe_ep4_serve_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //runtime/cuda:cuda_moe_fp8_test
#   //kernels/moe:moe_fp8_cuda_test tool//runtime:tandem_worker tool//router:tandem_router
#   tool//router:tandem_cli tool//tests/bench:tandem_bench, tar'd and xz'd.
#   1. GPU 3, while the first worker loads: cuda_moe_fp8_test (the FP8 MoE prefill path, its
#      stage-wise deviations printed) for each seed of SEEDS (default 1..7) and one fresh seed,
#      then moe_fp8_cuda_test twice (fresh seeds); all under one timeout (TEST_SECS, default 45);
#   2. serving with EP on all 4 GPUs (moe_serve, moe_serve_lib.sh: tandem_router + one mixed
#      tandem_worker, dummy qwen3-30b-a3b, tandem_bench 1024 in / 256 out at concurrency 1 / 32 /
#      128 with 2 / 32 / 128 requests): --tp=4 --enable_expert_parallel (EP (a)), its benches
#      after step 1 ended; then, while DEADLINE (default 125 s from the start) leaves 50 s,
#      --dp_attention on top (EP (b)).
# Logs: $OUT/logs.tar.gz and $OUT/summary.txt (test verdicts, deviation lines, bench lines).
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_ep4_out} SECS=${TEST_SECS:-45}
DEADLINE=${DEADLINE:-125}
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
source "$(dirname "${BASH_SOURCE[0]}")/moe_serve_lib.sh"
BD=/tmp/moe_ep4_bundle
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TANDEM_REQUIRE_GPU=1
BIN=$BD/bin

SEEDS=${SEEDS:-1 2 3 4 5 6 7}
tests="for s in $SEEDS ''; do echo \"== cuda_moe_fp8_test seed \${s:-fresh}\";
  TANDEM_TEST_SEED=\$s '$BIN/runtime/cuda/cuda_moe_fp8_test'; echo \"rc=\$?\"; done;
  for i in 1 2; do '$BIN/kernels/moe/moe_fp8_cuda_test'; echo \"rc=\$?\"; done"
gpu_job fp8_tests 3 bash -c "$tests"
TESTS_PID=$!

serve() {  # TAG WORKER_FLAGS...
  SERVE_N1=2 SERVE_T1=12 SERVE_T32=18 SERVE_T128=25 SERVE_SEED=400 moe_serve "$LOG/serve_$1" \
    0,1,2,3 "$@"
}
SERVE_BEFORE_BENCH="wait $TESTS_PID" serve tp4_ep_a --tp=4 --enable_expert_parallel
wait
if ((SECONDS - T0 + 50 < DEADLINE)); then
  serve tp4_ep_b --tp=4 --enable_expert_parallel --dp_attention
else
  echo "EP (b) skipped at $((SECONDS - T0)) s (deadline $DEADLINE s)" > "$LOG/skipped.txt"
fi

{
  echo "== device: $(head -n 1 "$LOG/gpus.txt") ($(grep -c '^GPU' "$LOG/gpus.txt") GPUs)"
  echo "== fp8 tests: rc/secs $(cat "$LOG/fp8_tests.rc" 2> /dev/null)"
  grep -E "^(== |seed=|rc=|per-|128 x)|\[  (PASSED|FAILED) |Failure|max\|dev\||act GEMM vs|CPU down" \
    "$LOG/fp8_tests.txt"
  cat "$LOG"/serve_*/up.txt "$LOG/skipped.txt" 2> /dev/null
  moe_bench_lines "$LOG"/serve_*/c*.json
  echo "== total wall $((SECONDS - T0)) s"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
