# shellcheck shell=bash
# One router + one mixed CUDA worker for the device-call scripts (moe_fp8_serve_call.sh,
# fp8_w16_serve_call.sh, moe_serve_lib.sh); sourced, not run. Needs BIN (the bundle's bin/).
#
# serve_start DIR GPUS TAG [NAME=VALUE ...] -- WORKER_FLAGS...: tandem_router on 127.0.0.1 (port
#   file DIR/router.port), then `tandem_worker --insecure --role=mixed --backend=cuda --device=0
#   --router=... --listen=127.0.0.1:0` with CUDA_VISIBLE_DEVICES=GPUS, the NAME=VALUE environment
#   and WORKER_FLAGS (the model, --kv_cache_bytes, --max_model_len, ...), logs DIR/router.log and
#   DIR/worker.log; waits up to SERVE_UP_S seconds (default 120) for the router to list it healthy.
#   Sets SERVE_ROUTER (host:port) and SERVE_PIDS, prints "TAG healthy=0|1 after N s" (at once
#   when the worker exits, with its last log line); returns 1 unless healthy. serve_stop stops what it started (call it either way).
# bench_summary FILE...: one line per tandem_bench --json FILE (its last two path parts, requests
#   OK, TTFT mean / p50 / p99, TPOT mean, ITL p50 / p99, output tok/s); missing files named.

serve_start() {
  local dir=$1 gpus=$2 tag=$3 envv=() i t0=$SECONDS up=0
  shift 3
  while [[ $# -gt 0 && $1 != -- ]]; do envv+=("$1"); shift; done
  [[ ${1:-} == -- ]] && shift
  SERVE_PIDS=()
  SERVE_ROUTER=
  mkdir -p "$dir"
  "$BIN/router/tandem_router" --insecure --listen=127.0.0.1:0 --port_file="$dir/router.port" \
    > "$dir/router.log" 2>&1 &
  SERVE_PIDS+=($!)
  for i in $(seq 1 300); do [[ -s $dir/router.port ]] && break; sleep 0.1; done
  if [[ ! -s $dir/router.port ]]; then
    echo "$tag healthy=0 after $((SECONDS - t0)) s (no router port)"
    return 1
  fi
  SERVE_ROUTER=$(cat "$dir/router.port")
  env ${envv[@]+"${envv[@]}"} CUDA_VISIBLE_DEVICES="$gpus" "$BIN/runtime/tandem_worker" --insecure \
    --role=mixed --backend=cuda --device=0 --router="$SERVE_ROUTER" --listen=127.0.0.1:0 \
    --port_file="$dir/worker.port" "$@" > "$dir/worker.log" 2>&1 &
  local worker=$!
  SERVE_PIDS+=("$worker")
  for i in $(seq 1 $((${SERVE_UP_S:-120} * 5))); do
    if "$BIN/router/tandem_cli" --insecure workers --router="$SERVE_ROUTER" --json 2> /dev/null |
      grep -q '"healthy":true'; then
      up=1
      break
    fi
    if ! kill -0 "$worker" 2> /dev/null; then  # it exited: no point waiting for it
      echo "$tag: the worker exited: $(tail -n 1 "$dir/worker.log")"
      break
    fi
    sleep 0.2
  done
  echo "$tag healthy=$up after $((SECONDS - t0)) s"
  [[ $up == 1 ]]
}

serve_stop() {
  local p
  for p in ${SERVE_PIDS[@]+"${SERVE_PIDS[@]}"}; do kill "$p" 2> /dev/null; done
  wait ${SERVE_PIDS[@]+"${SERVE_PIDS[@]}"} 2> /dev/null
  SERVE_PIDS=()
}

bench_summary() {
  local f
  for f in "$@"; do
    [[ -s $f ]] || { echo "$f missing"; continue; }
    python3 - "$f" << 'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("%s: %d ok, TTFT mean %.1f p50 %.1f p99 %.1f ms, TPOT mean %.3f ms, ITL p50 %.3f p99 %.3f"
          " ms, output tok/s %.1f" % ("/".join(sys.argv[1].split("/")[-2:]),
                                      r["successful_requests"], t["mean"], t.get("p50", -1),
                                      t["p99"], p["mean"], i["p50"], i["p99"],
                                      r["output_token_throughput"]))
PY
  done
}
