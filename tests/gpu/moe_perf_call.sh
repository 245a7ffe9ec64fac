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
serve() {
  local dir=$LOG/serve pids=()
  mkdir -p "$dir"
  wait_file() { for _ in $(seq 1 600); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }
  "$BIN/router/tandem_router" --insecure --listen=127.0.0.1:0 --port_file="$dir/router.port" \
    >"$dir/router.log" 2>&1 &
  pids+=($!)
  wait_file "$dir/router.port" || return 1
  local router
  router=$(cat "$dir/router.port")
  CUDA_VISIBLE_DEVICES=3 "$BIN/runtime/tandem_worker" --insecure --role=mixed --worker_id=moe \
    --backend=cuda --load_format=dummy --dummy_config=qwen3-30b-a3b --router="$router" --device=0 \
    --kv_cache_bytes=30000000000 --max_model_len=4096 --listen=127.0.0.1:0 \
    --port_file="$dir/worker.port" >"$dir/worker.log" 2>&1 &
  pids+=($!)
  local t0=$SECONDS up=0
  for _ in $(seq 1 200); do
    if "$BIN/router/tandem_cli" --insecure workers --router="$router" --json 2>/dev/null |
      grep -q '"healthy":true'; then
      up=1
      break
    fi
    sleep 0.2
  done
  echo "worker healthy=$up after $((SECONDS - t0)) s" >"$dir/up.txt"
  if [[ $up == 1 ]]; then
    local c n seed=200
    for c in 1 32 128; do
      case $c in 1) n=${N_C1:-4} ;; 32) n=${N_C32:-32} ;; *) n=${N_C128:-128} ;; esac
      seed=$((seed + 1))
      timeout "$((c == 1 ? 20 : c == 32 ? 25 : 35))" "$BIN/tests/bench/tandem_bench" \
        --router="$router" --rate=inf --num_requests="$n" --max_concurrency="$c" --prompt_len=1024 --output_len=256 \
        --warmup=1 --seed=$seed --json >"$dir/c$c.json" 2>"$dir/c$c.err"
      echo "c$c: rc=$? n=$n" >>"$dir/up.txt"
    done
  fi
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}

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
for c in 1 32 128; do
  [[ -s $LOG/serve/c$c.json ]] || continue
  python3 - "$c" "$LOG/serve/c$c.json" <<'PY'
import json, sys
for line in open(sys.argv[2]):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("serve c=%s: %d ok, TTFT mean %.1f p99 %.1f ms, TPOT mean %.2f ms, ITL p50 %.2f p99 %.2f ms,"
          " output tok/s %.1f" % (sys.argv[1], r["successful_requests"], t["mean"], t["p99"],
                                  p["mean"], i["p50"], i["p99"], r["output_token_throughput"]))
PY
done
