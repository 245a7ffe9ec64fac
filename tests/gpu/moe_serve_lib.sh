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

source "$(dirname "${BASH_SOURCE[0]}")/serve_lib.sh"

moe_serve() {
  local dir=$1 gpus=$2 tag=$3 up=0
  shift 3
  mkdir -p "$dir"
  # serve_start in this shell (its SERVE_* variables), its line kept for up.txt.
  serve_start "$dir" "$gpus" "$tag" -- --worker_id="moe-$tag" --load_format=dummy \
    --dummy_config=qwen3-30b-a3b --kv_cache_bytes=30000000000 --max_model_len=4096 "$@" \
    > "$dir/up.line" && up=1
  echo "$tag: worker healthy=$up ($(cat "$dir/up.line"))" > "$dir/up.txt"
  rm -f "$dir/up.line"
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
      timeout "$secs" "$BIN/tests/bench/tandem_bench" --router="$SERVE_ROUTER" --rate=inf \
        --num_requests="$n" --max_concurrency="$c" --prompt_len=1024 --output_len=256 \
        --warmup=1 --seed=$seed --json >"$dir/c$c.json" 2>"$dir/c$c.err"
      echo "$tag c$c: rc=$? n=$n (at $SECONDS s)" >>"$dir/up.txt"
    done
  fi
  serve_stop
}

moe_bench_lines() { bench_summary "$@"; }
