#!/usr/bin/env bash
# Admission under load (issue: continuous batching starved in the worker): TTFT / TPOT / ITL
# from tandem_bench through a real router, at light Poisson rates and at concurrency 1, for
#   1. one mixed worker, and
#   2. router + prefill worker + decode worker (both on the same device: the decode worker's
#      admission of a newly loaded request is the second token's latency).
#
#   tests/gpu/serve_admission_bench.sh BUNDLE_DIR LOG_DIR
#
# Environment (defaults are the issue's setup: one H100/H200, Llama-3-8B shape, dummy bf16):
#   BACKEND=cuda  MODEL=llama3-8b  PROMPT=1024  KV_BYTES=8589934592 (per worker)
#   SCALE=1       multiplies request counts (0.25 for a quick check)
#   ROWS="unloaded 1:16 1:512 4:128 4:128:c1 pd:1:512"   which rows to run (RATE:OUT[:c1]);
#                 sat:OUT sends 128 requests at once (saturation)
#   EXTRA_WORKER_FLAGS   e.g. "--num_threads=2" for BACKEND=cpu
#   WORKER_BIN    another tandem_worker binary (e.g. an older build, for before/after)
# BUNDLE_DIR: tests/gpu/bundle.sh OUT tool//runtime:tandem_worker tool//router:tandem_router
#   tool//router:tandem_cli tool//tests/bench:tandem_bench   (or bazel-bin itself: BIN=DIR).
# Prints one line per row (rate, outputs, TTFT mean/p50/p99, TPOT mean, ITL p50/p99) and keeps
# tandem_bench's JSON under LOG_DIR.
set -uo pipefail
LOG=${2:?log dir}
mkdir -p "$LOG"
if [[ -n ${BIN:-} ]]; then
  W=$BIN/runtime/tandem_worker R=$BIN/router/tandem_router C=$BIN/router/tandem_cli
  TB=$BIN/tests/bench/tandem_bench
else
  B=$(cd "${1:?bundle dir}" && pwd)
  export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  W=${WORKER_BIN:-$B/bin/runtime/tandem_worker} R=$B/bin/router/tandem_router C=$B/bin/router/tandem_cli
  TB=$B/bin/tests/bench/tandem_bench
fi
BACKEND=${BACKEND:-cuda} MODEL=${MODEL:-llama3-8b} PROMPT=${PROMPT:-1024}
KV_BYTES=${KV_BYTES:-8589934592} SCALE=${SCALE:-1}
ROWS=${ROWS:-"unloaded 1:16 1:512 4:128 4:128:c1 pd:1:512"}
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; pids=(); }
trap stop_all EXIT
wait_file() { for _ in $(seq 1 3000); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }
count() { python3 -c "import math; print(max(4, math.ceil($1 * $SCALE)))"; }

# start_cluster NAME ROLE...: a router and one worker per role, all on device 0.
start_cluster() {
  local name=$1; shift
  rm -f "$LOG"/*.port
  "$R" --insecure --listen=127.0.0.1:0 --port_file="$LOG/router.port" >"$LOG/$name-router.log" 2>&1 &
  pids+=($!)
  wait_file "$LOG/router.port" || { echo "router did not start"; return 1; }
  ROUTER=$(cat "$LOG/router.port")
  for role in "$@"; do
    # shellcheck disable=SC2086
    "$W" --insecure --role="$role" --worker_id="$name-$role" --backend="$BACKEND" --load_format=dummy \
      --dummy_config="$MODEL" --router="$ROUTER" --device=0 --kv_cache_bytes="$KV_BYTES" \
      --max_model_len=4096 --listen=127.0.0.1:0 --port_file="$LOG/$role.port" \
      ${EXTRA_WORKER_FLAGS:-} >"$LOG/$name-$role.log" 2>&1 &
    pids+=($!)
  done
  for role in "$@"; do
    wait_file "$LOG/$role.port" || { tail -20 "$LOG/$name-$role.log"; return 1; }
  done
  for _ in $(seq 1 300); do
    [[ $("$C" --insecure workers --router="$ROUTER" --json 2>/dev/null | grep -o "\"healthy\":true" | wc -l) -ge $# ]] && return 0
    sleep 0.2
  done
  echo "workers did not become healthy"; return 1
}

# bench ROW_NAME RATE OUT N [MAX_CONCURRENCY]. Each row its own seed: no prompt of one row is a
# prefix-cache hit for the next (the same worker serves several rows).
seed=100
bench() {
  seed=$((seed + 1))
  "$TB" --router="$ROUTER" --rate="$2" --num_requests="$4" --prompt_len="$PROMPT" \
    --output_len="$3" --max_concurrency="${5:-0}" --warmup=3 --seed=$seed --slo_ttft_ms=500 --json \
    >"$LOG/$1.json" 2>"$LOG/$1.err" || { echo "$1: tandem_bench failed"; cat "$LOG/$1.err"; }
  python3 - "$1" "$LOG/$1.json" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
for line in open(path):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("%-16s %5s %5d %8.1f %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f" % (
        name, r["rate"], r["successful_requests"], t["mean"], t["p50"], t["p99"], p["mean"],
        i["p50"], i["p99"], r["goodput"]))
PY
}

printf '%-16s %5s %5s %8s %8s %8s %8s %8s %8s %8s\n' row rate reqs ttft_avg ttft_p50 \
  ttft_p99 tpot_avg itl_p50 itl_p99 goodput
mixed_up=0
for row in $ROWS; do
  if [[ $row == pd:* ]]; then
    stop_all; mixed_up=0
    start_cluster pd prefill decode || exit 1
    IFS=: read -r _ rate out <<<"$row"
    bench "pd-$rate-$out" "$rate" "$out" "$(count 40)"
    continue
  fi
  if [[ $mixed_up == 0 ]]; then
    start_cluster mixed mixed || exit 1
    mixed_up=1
  fi
  case $row in
    unloaded) bench unloaded inf 16 "$(count 20)" 1 ;;
    sat:*) IFS=: read -r _ out <<<"$row"; bench "mixed-sat-$out" inf "$out" "$(count 128)" ;;
    *:c1) IFS=: read -r rate out _ <<<"$row"; bench "mixed-$rate-$out-c1" "$rate" "$out" "$(count 40)" 1 ;;
    *) IFS=: read -r rate out <<<"$row"
       n=$(count 40); [[ $rate == 4 ]] && n=$(count 80)
       bench "mixed-$rate-$out" "$rate" "$out" "$n" ;;
  esac
done
