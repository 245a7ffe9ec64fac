#!/usr/bin/env bash
# P -> D KV handoff benchmark on a 2-GPU machine: a real router, a prefill worker on GPU 0 and a
# decode worker on GPU 1 (--backend=cuda, random Llama-3-8B weights by default), once with KV
# over UCX (device memory staged through the prefill worker's host mirror) and once over NCCL
# (device to device). Each request has a fresh random prompt (no prefix-cache hits on either
# side) and max_tokens=2, so it is: prefill on P (+ the mirror sync for UCX) = TTFT, then the KV
# load and one decode step on D = the gap to the second token.
#
#   tests/gpu/serve_pd_kv_bench.sh BUNDLE_DIR LOG_DIR [DUMMY_CONFIG=llama3-8b]
#       [PROMPT_LENS=1024,4096,16384] [REQUESTS=4]
#
# BUNDLE_DIR as for serve_cuda_smoke.sh. Per transport and prompt length it prints the KV bytes
# per request, the decode worker's mean load time (posted -> seen finished, from its
# WorkerStats: kv_load_micros / kv_loads_completed) and the GB/s that makes, and the client's
# mean TTFT and second-token gap. TRANSPORTS="ucx nccl" and BACKEND=cuda may be overridden
# (BACKEND=cpu TRANSPORTS=ucx checks the script itself on a machine without GPUs).
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
MODEL=${3:-llama3-8b}
LENS=${4:-1024,4096,16384}
REQUESTS=${5:-4}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
W=$B/bin/runtime/tandem_worker R=$B/bin/router/tandem_router C=$B/bin/router/tandem_cli
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
wait_file() { for _ in $(seq 1 1200); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }
stats() { "$C" --insecure stats --worker="$(cat "$1")" --json; }

printf '%-9s %7s %9s %10s %12s %9s %9s %12s\n' transport tokens MiB/req requests \
  load_ms_mean GB/s ttft_ms 2nd_tok_ms
for transport in ${TRANSPORTS:-ucx nccl}; do
  rm -f "$LOG"/*.port
  "$R" --insecure --listen=127.0.0.1:0 --port_file="$LOG/router.port" >"$LOG/router-$transport.log" 2>&1 &
  pids+=($!)
  wait_file "$LOG/router.port" || { echo "router did not start"; exit 1; }
  ROUTER=$(cat "$LOG/router.port")
  dev=0
  for role in prefill decode; do
    "$W" --insecure --role=$role --worker_id=$transport-$role --backend="${BACKEND:-cuda}" --load_format=dummy \
      --dummy_config="$MODEL" --router="$ROUTER" --device=$dev --kv_transport=$transport \
      --kv_cache_bytes=$((6 << 30)) --max_model_len=32768 --listen=127.0.0.1:0 \
      --port_file="$LOG/$role.port" >"$LOG/$transport-$role.log" 2>&1 &
    pids+=($!)
    dev=$((dev + 1))
  done
  wait_file "$LOG/prefill.port" && wait_file "$LOG/decode.port" ||
    { tail "$LOG/$transport-prefill.log" "$LOG/$transport-decode.log"; exit 1; }
  for _ in $(seq 1 100); do "$C" --insecure health --router="$ROUTER" >/dev/null 2>&1 && break; sleep 0.2; done
  seed=1
  IFS=, read -ra lens <<<"$LENS"
  for len in 64 "${lens[@]}"; do  # 64: warm-up (peer connection, graphs), not printed
    before=$(stats "$LOG/decode.port") || exit 1
    : >"$LOG/client.jsonl"
    for _ in $(seq 1 "$REQUESTS"); do
      ids=$(python3 -c "import random,sys; r=random.Random($seed); print(','.join(str(r.randrange(1, 30000)) for _ in range($len)))")
      seed=$((seed + 1))
      "$C" --insecure generate --router="$ROUTER" --prompt_ids="$ids" --max_tokens=2 --ignore_eos --json \
        >>"$LOG/client.jsonl" || { echo "generate failed ($transport, $len)"; exit 1; }
    done
    after=$(stats "$LOG/decode.port") || exit 1
    [[ $len == 64 ]] && continue
    python3 - "$transport" "$len" "$before" "$after" "$LOG/client.jsonl" <<'PY'
import json, sys
transport, n, b, a, client = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
d = lambda k: int(a[k]) - int(b[k])
loads, micros, nbytes = d("kv_loads_completed"), d("kv_load_micros"), d("kv_bytes_received")
assert d("kv_load_failures") == 0, (b, a)
rows = [json.loads(l) for l in open(client) if l.strip()]
ttft = sum(r["ttft_ms"] for r in rows) / len(rows)
gap = sum(r["itl_ms_p50"] for r in rows) / len(rows)
print("%-9s %7d %9.1f %10d %12.2f %9.1f %9.2f %12.2f" % (
    transport, n, nbytes / max(loads, 1) / 2**20, loads, micros / max(loads, 1) / 1e3,
    nbytes / max(micros, 1) / 1e3, ttft, gap))
PY
  done
  cleanup
  pids=()
done
