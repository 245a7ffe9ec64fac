#!/usr/bin/env bash
# Issue 32 in one device call on nvidia-h200-x4: EP (b) with the fixed-capacity dispatch in CUDA
# graphs (runtime/cuda/cuda_moe_all_to_all.h), its A/B against the eager counts-read-back path,
# and MoE serving through the router with EP on 2 and 4 GPUs. Phases (lanes in parallel):
#   1. GPU 0: moe_dispatch_cuda_test, moe_cuda_test, moe_cuda_layer_test; then GPUs 0-1:
#      moe_ep_cuda_golden.sh ROWS=dp over NCCL (EP (b) graphs vs TP=1 / transformers, idle rank,
#      padded eager vs graphs);
#      GPUs 2-3: decode_step_bench --shape=qwen3-30b-a3b --tp=2 --dp_attention=1, --dp_graphs=1
#      then 0 (the A/B), batches 1 and 32, context 512;
#   2. serving, two at once: router + one tandem_worker --tp=2 --enable_expert_parallel on GPUs
#      0-1 (EP (a)) and one with --dp_attention on GPUs 2-3 (EP (b)), dummy qwen3-30b-a3b,
#      tandem_bench 1024 in / 256 out at concurrency 1 / 32 / 128 (N_C1 / N_C32 / N_C128
#      requests, default 2 / 32 / 128);
#   3. while the call's deadline (DEADLINE seconds, default 125) allows: all 4 GPUs,
#      decode_step_bench --tp=4 --dp_attention=1 --dp_graphs=1 and 0, then serving EP (b) --tp=4.
#
#   tests/gpu/moe_ep_graph_call.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //kernels/moe:moe_dispatch_cuda_test //kernels/moe:moe_cuda_test
#   //kernels/moe:moe_cuda_layer_test //runtime/cuda:decode_step_bench tool//runtime:generate
#   tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
#   tool//tests/bench:tandem_bench. Every step under its own timeout, its log in LOG_DIR; a
# summary to stdout. Run from the repository root.
set -uo pipefail
[[ $# -eq 2 ]] || {
  echo "usage: $0 BUNDLE_DIR LOG_DIR" >&2
  exit 2
}
B=$(cd "$1" && pwd)
LOG=$2
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TANDEM_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
nvidia-smi -L >"$LOG/gpus.txt" 2>&1
BIN=$B/bin
DSB=$BIN/runtime/cuda/decode_step_bench
DEADLINE=${DEADLINE:-125}
source "$(dirname "${BASH_SOURCE[0]}")/moe_serve_lib.sh"

step() {  # GPUS NAME SECONDS CMD...
  local gpus=$1 name=$2 secs=$3
  shift 3
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpus timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
  echo "== $name (GPUs $gpus): rc=$? in $((SECONDS - t0)) s (at $SECONDS s)" >"$LOG/$name.sum"
}

bench() {  # GPUS NAME SECONDS FLAGS...
  step "$1" "$2" "$3" "$DSB" --shape=qwen3-30b-a3b --batches=1,32 --context=512 --steps=32 "${@:4}"
}

# serve GPUS TAG WORKER_FLAGS...: moe_serve (moe_serve_lib.sh) under $LOG/serve_TAG, 2 / 32 / 128
# requests.
serve() {
  SERVE_N1=2 SERVE_T1=12 SERVE_T32=18 SERVE_T128=25 SERVE_SEED=300 moe_serve "$LOG/serve_$2" "$@"
}

phase1_tests() {
  step 0 moe_dispatch_cuda_test 15 "$BIN/kernels/moe/moe_dispatch_cuda_test"
  step 0 moe_cuda_test 15 "$BIN/kernels/moe/moe_cuda_test"
  step 0 moe_cuda_layer_test 20 "$BIN/kernels/moe/moe_cuda_layer_test"
  ROWS=dp SHARE="" step 0,1 moe_ep_cuda_golden_dp 60 tests/gpu/moe_ep_cuda_golden.sh "$B" \
    "$LOG/golden"
}

phase1_bench() {
  bench 2,3 dsb_tp2_dp_graphs 35 --tp=2 --dp_attention=1 --dp_graphs=1
  bench 2,3 dsb_tp2_dp_eager 35 --tp=2 --dp_attention=1 --dp_graphs=0
}

phase1_tests &
phase1_bench &
wait
serve 0,1 tp2_ep_a --tp=2 --enable_expert_parallel &
serve 2,3 tp2_ep_b --tp=2 --enable_expert_parallel --dp_attention &
wait
if ((SECONDS + 45 < DEADLINE)); then
  bench 0,1,2,3 dsb_tp4_dp_graphs 30 --tp=4 --dp_attention=1 --dp_graphs=1
  bench 0,1,2,3 dsb_tp4_dp_eager 30 --tp=4 --dp_attention=1 --dp_graphs=0
fi
if ((SECONDS + 40 < DEADLINE)); then
  serve 0,1,2,3 tp4_ep_b --tp=4 --enable_expert_parallel --dp_attention
fi

for f in "$LOG"/*.sum; do
  cat "$f"
  grep -vE "^(I|W)[0-9]{4}" "${f%.sum}.log" | tail -n 8
done
cat "$LOG"/serve_*/up.txt 2>/dev/null
moe_bench_lines "$LOG"/serve_*/c*.json
