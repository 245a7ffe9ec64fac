# shellcheck shell=bash
# Serving through the router for the MoE device-call scripts (moe_perf_call.sh,
# moe_ep_graph_call.sh); sourced, not run. Needs BIN (the bundle's bin/).
#
# moe_serve DIR GPUS TAG WORKER_FLAGS...: tandem_router, one mixed tandem_worker (dummy
#   qwen3-30b-a3b, --device=0 of CUDA_VISIBLE_DEVICES=GPUS, WORKER_FLAGS added), then tandem_bench
#   1024 in / 256 out at concurrency 1, 32 and 128: N_C1 / N_C32 / N_C128 requests (defaults
#   SERVE_N1 / SERVE_N32 / SERVE_N128, else 4 / 32 / 128), each under SERVE_T1 / SERVE_T32 /
#   SERVE_T128 seconds (default 20 / 25 / 35), seeds from SERVE_SEED (default 200) on. Logs,
#   DIR/cC.json and DIR/up.txt ("TAG ..." lines) under DIR; everything it started is stopped.
#   SERVE_BEFORE_BENCH: a command run once the worker is healthy, before the first tandem_bench
#   (e.g. `wait` for a test job that shared the GPUs while the worker loaded).
# moe_bench_lines FILE...: one summary line per tandem_bench --json FILE (LABEL: the path).

moe_serve() {
  local dir=$1 gpus=$2 tag=$3 pids=()
  shift 3
  mkdir -p "$dir"
  "$BIN/router/tandem_router" --insecure --listen=127.0.0.1:0 --port_file="$dir/router.port" \
    >"$dir/router.log" 2>&1 &
  pids+=($!)
  local i router t0=$SECONDS up=0
  for i in $(seq 1 600); do [[ -s $dir/router.port ]] && break; sleep 0.1; done
  [[ -s $dir/router.port ]] || return 1
  router=$(cat "$dir/router.port")
  CUDA_VISIBLE_DEVICES=$gpus "$BIN/runtime/tandem_worker" --insecure --role=mixed \
    --worker_id="moe-$tag" --backend=cuda --load_format=dummy --dummy_config=qwen3-30b-a3b \
    --router="$router" --device=0 --kv_cache_bytes=30000000000 --max_model_len=4096 \
    --listen=127.0.0.1:0 --port_file="$dir/worker.port" "$@" >"$dir/worker.log" 2>&1 &
  pids+=($!)
  for i in $(seq 1 200); do
    if "$BIN/router/tandem_cli" --insecure workers --router="$router" --json 2>/dev/null |
      grep -q '"healthy":true'; then
      up=1
      break
    fi
    sleep 0.2
  done
  echo "$tag: worker healthy=$up after $((SECONDS - t0)) s" >"$dir/up.txt"
  if [[ $up == 1 ]]; then
    [[ -z ${SERVE_BEFORE_BENCH:-} ]] || eval "$SERVE_BEFORE_BENCH"
    local c n secs seed=${SERVE_SEED:-200}
    for c in 1 32 128; do
      case $c in
        1) n=${N_C1:-${SERVE_N1:-4}} secs=${SERVE_T1:-20} ;;
        32) n=${N_C32:-${SERVE_N32:-32}} secs=${SERVE_T32:-25} ;;
        *) n=${N_C128:-${SERVE_N128:-128}} secs=${SERVE_T128:-35} ;;
      esac
      seed=$((seed + 1))
      timeout "$secs" "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf \
        --num_requests="$n" --max_concurrency="$c" --prompt_len=1024 --output_len=256 \
        --warmup=1 --seed=$seed --json >"$dir/c$c.json" 2>"$dir/c$c.err"
      echo "$tag c$c: rc=$? n=$n (at $SECONDS s)" >>"$dir/up.txt"
    done
  fi
  for i in "${pids[@]}"; do kill "$i" 2>/dev/null; done
  wait "${pids[@]}" 2>/dev/null
}

moe_bench_lines() {
  local f
  for f in "$@"; do
    [[ -s $f ]] || continue
    python3 - "$f" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("%s: %d ok, TTFT mean %.1f p99 %.1f ms, TPOT mean %.2f ms, ITL p50 %.2f p99 %.2f ms,"
          " output tok/s %.1f" % (sys.argv[1], r["successful_requests"], t["mean"], t["p99"],
                                  p["mean"], i["p50"], i["p99"], r["output_token_throughput"]))
PY
  done
}
