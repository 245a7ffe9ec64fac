#!/usr/bin/env bash
# Issue 32's MoE performance tables in one device call on a 4-GPU machine (nvidia-h200-x4), four
# lanes at once, one GPU each:
#   GPU 0: moe_cuda_test and moe_cuda_layer_test (every kernel vs the CPU reference,
#          MoeRouteAndPermute and the PDL / graph decode layer included), then moe_cuda_bench
#          (the layer alone, both shapes, tokens 1..8192; fused route + PDL in CUDA graphs at
#          T <= 16), then
#          decode_step_bench --shape=mixtral-8x7b with TANDEM_MOE_KERNELS=new;
#   GPU 1: tests/gpu/moe_torch_bench.py (PyTorch's per-expert loop and torch._grouped_mm at the
#          same shapes), then tests/gpu/moe_cuda_golden.sh with TANDEM_MOE_KERNELS=new (whole
#          MoE models vs transformers through the new kernel choices);
#   GPU 2: decode_step_bench --shape=qwen3-30b-a3b --batches=1,8,64, default kernels then
#          TANDEM_MOE_KERNELS=new (the A/B of fused_route + pdl);
#   GPU 3: serving through the router: tandem_router + one mixed tandem_worker (dummy
#          qwen3-30b-a3b, default kernels) + tandem_bench, 1024 in / 256 out at concurrency
#          1, 32 and 128 (request counts N_C1 / N_C32 / N_C128, default 4 / 32 / 128).
#
#   tests/gpu/moe_perf_call.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //kernels/moe:moe_cuda_test //kernels/moe:moe_cuda_layer_test
#   //kernels/moe:moe_cuda_bench
#   //runtime/cuda:decode_step_bench tool//runtime:generate tool//runtime:tandem_worker
#   tool//router:tandem_router tool//router:tandem_cli tool//tests/bench:tandem_bench
# Each step has its own timeout (a lane ~100 s at most) and its log in LOG_DIR; the
# summary (rc, seconds and the last lines of each) goes to stdout. Run from the repository root.
set -uo pipefail
[[ $# -eq 2 ]] || {
  echo "usage: $0 BUNDLE_DIR LOG_DIR" >&2
  exit 2
}
B=$(cd "$1" && pwd)
LOG=$2
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TANDEM_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L >"$LOG/gpus.txt" 2>&1
BIN=$B/bin
DSB=$BIN/runtime/cuda/decode_step_bench
source "$(dirname "${BASH_SOURCE[0]}")/moe_serve_lib.sh"
NEW=new

# step GPU NAME SECONDS CMD...: CMD on GPU under a timeout, output to $LOG/NAME.log, then a
# summary line into $LOG/NAME.sum.
step() {
  local gpu=$1 name=$2 secs=$3
  shift 3
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" "$@" >"$LOG/$name.log" 2>&1
  echo "== $name (GPU $gpu): rc=$? in $((SECONDS - t0)) s" >"$LOG/$name.sum"
}

lane0() {
  step 0 moe_cuda_test 25 "$BIN/kernels/moe/moe_cuda_test"
  step 0 moe_cuda_layer_test 25 "$BIN/kernels/moe/moe_cuda_layer_test"
  step 0 moe_cuda_bench 40 "$BIN/kernels/moe/moe_cuda_bench" --iters=10
  TANDEM_MOE_KERNELS=$NEW step 0 decode_mixtral_new 40 "$DSB" --shape=mixtral-8x7b \
    --batches=1,8 --context=1024 --steps=32
}

lane1() {
  PYTHONUNBUFFERED=1 step 1 torch_bench 45 python3 tests/gpu/moe_torch_bench.py --iters=10
  TANDEM_MOE_KERNELS=$NEW step 1 moe_cuda_golden_new 55 tests/gpu/moe_cuda_golden.sh "$B" \
    "$LOG/golden"
}

lane2() {
  step 2 decode_qwen3_default 45 "$DSB" --shape=qwen3-30b-a3b --batches=1,8,64 --context=1024 \
    --steps=32
  TANDEM_MOE_KERNELS=$NEW step 2 decode_qwen3_new 45 "$DSB" --shape=qwen3-30b-a3b \
    --batches=1,8,64 --context=1024 --steps=32
}

# Serving: router + one mixed worker on GPU 3, then tandem_bench per concurrency.
serve() { moe_serve "$LOG/serve" 3 gpu3; }

lane0 &
lane1 &
lane2 &
serve &
wait
for f in "$LOG"/*.sum; do
  cat "$f"
  name=$(basename "$f" .sum)
  grep -vE "^(I|W)[0-9]{4}" "$LOG/$name.log" | tail -n 14
done
cat "$LOG/serve/up.txt" 2>/dev/null
moe_bench_lines "$LOG"/serve/c1.json "$LOG"/serve/c32.json "$LOG"/serve/c128.json
