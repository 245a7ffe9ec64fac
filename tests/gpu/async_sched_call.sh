#!/usr/bin/env bash
# Async scheduling (EngineConfig::async_scheduling, issues 31 / 35) in ONE device call on
# nvidia-h200-x4:
#   1. at the same time: decode_step_bench Llama-3-8B TP=1 (GPU 0), overlap off then on, batches
#      1/8/64; cuda_engine_test's AsyncSchedulingGivesTheSameTokens (GPU 1); async_cuda_golden.sh
#      on GPUs 2-3 (TP=2 over NCCL; VARIANTS fixtures);
#   2. decode_step_bench Llama-3-8B TP=4 (GPUs 0-3), overlap off then on, batches 1/8/64.
#
#   tests/gpu/async_sched_call.sh BUNDLE_DIR LOG_DIR
# BUNDLE_DIR: tests/gpu/bundle.sh //runtime/cuda:cuda_engine_test //runtime/cuda:decode_step_bench
# tool//runtime:generate. T1 / T2 (env): each phase's limit in seconds (default 40 / 35).
set -uo pipefail
B=$(cd "${1:?bundle}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
D=$B/bin/runtime/cuda/decode_step_bench
ARGS=(--steps=24 --batches=1,8,64 --async_scheduling=0,1)
quiet() { grep -vE "^(I|W|E)[0-9]{4}"; }
T0=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout "${T1:-40}" "$D" "${ARGS[@]}" > "$LOG/tp1.log" 2>&1 &
tp1=$!
CUDA_VISIBLE_DEVICES=1 TANDEM_REQUIRE_GPU=1 timeout "${T1:-40}" \
  "$B/bin/runtime/cuda/cuda_engine_test" --gtest_filter='*Async*' > "$LOG/engine_test.log" 2>&1 &
et=$!
CUDA_VISIBLE_DEVICES=2,3 SHARE="" VARIANTS="${VARIANTS:-llama_bf16 qwen2_f32}" timeout "${T1:-40}" \
  tests/gpu/async_cuda_golden.sh "$B" "$LOG/golden" > "$LOG/golden.log" 2>&1 &
gold=$!
wait $tp1; echo "== TP=1 bench rc=$? ($(($(date +%s) - T0)) s)"; quiet < "$LOG/tp1.log"
wait $et; echo "== cuda_engine_test rc=$?"; grep -E "OK \]|FAILED|Failure|PASSED|Expected|Which|seed" "$LOG/engine_test.log" | head -20
wait $gold; echo "== async_cuda_golden rc=$? ($(($(date +%s) - T0)) s)"; grep -vE "^(I|W|E)[0-9]{4}" "$LOG/golden.log" | tail -20
timeout "${T2:-35}" "$D" --tp=4 "${ARGS[@]}" 2>&1 | quiet | tee "$LOG/tp4.log"
echo "== TP=4 bench rc=${PIPESTATUS[0]} ($(($(date +%s) - T0)) s)"
