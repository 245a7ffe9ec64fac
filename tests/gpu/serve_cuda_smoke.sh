#!/usr/bin/env bash
# GPU serving smoke test: a real router and --backend=cuda workers (separate processes, loopback)
# serve requests through tandem_cli; the CUDA mixed worker must give the same greedy tokens as a
# CPU mixed worker is NOT expected (bf16 vs fp32), so this checks liveness, token counts, JSON
# timing fields and clean shutdown. With a UCX agent that accepts device memory it also runs
# one prefill + one decode CUDA worker (P -> D KV over UCX, staged through host memory).
#
#   tests/gpu/serve_cuda_smoke.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR was made by tests/gpu/bundle.sh with tool//runtime:tandem_worker
# tool//router:tandem_router tool//router:tandem_cli. Prints "N passed, N failed, N skipped".
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
W=$B/bin/runtime/tandem_worker R=$B/bin/router/tandem_router C=$B/bin/router/tandem_cli
passed=0 failed=0 skipped=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
check() {  # name, command...
  local name=$1; shift
  if "$@" >"$LOG/$name.out" 2>&1; then echo "PASS $name"; passed=$((passed + 1));
  else echo "FAIL $name (see $name.out)"; tail -5 "$LOG/$name.out"; failed=$((failed + 1)); fi
}
wait_file() { for _ in $(seq 1 600); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }

"$R" --listen=127.0.0.1:0 --port_file="$LOG/router.port" >"$LOG/router.log" 2>&1 &
pids+=($!)
wait_file "$LOG/router.port" || { echo "router did not start"; exit 1; }
ROUTER=$(cat "$LOG/router.port")
COMMON=(--backend=cuda --load_format=dummy --dummy_config=llama-100m --router="$ROUTER"
        --kv_cache_bytes=1073741824 --listen=127.0.0.1:0)
"$W" --role=mixed --worker_id=cuda-mixed "${COMMON[@]}" --port_file="$LOG/mixed.port" \
  >"$LOG/mixed.log" 2>&1 &
pids+=($!)
wait_file "$LOG/mixed.port" || { echo "mixed worker did not start"; tail "$LOG/mixed.log"; exit 1; }
sleep 2
check workers "$C" workers --router="$ROUTER"
gen() {
  "$C" generate --router="$ROUTER" --prompt_ids="$1" --max_tokens="$2" --ignore_eos --json \
    >"$LOG/gen.json" || return 1
  python3 - "$LOG/gen.json" "$2" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
toks = j.get("token_ids") or j.get("tokens") or []
assert len(toks) == int(sys.argv[2]), j
print(j)
PY
}
check mixed_generate gen 1,450,4996,17354,29871 32
check mixed_long_prompt gen "$(seq -s, 100 900)" 16
# 16 concurrent requests (continuous batching + decode graphs).
conc() {
  local ps=()
  for i in $(seq 1 16); do
    "$C" generate --router="$ROUTER" --prompt_ids="$i,$((i+7)),$((i*3+11))" --max_tokens=24 \
      --ignore_eos --json >"$LOG/c$i.json" 2>&1 & ps+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || return 1; done
}
check mixed_concurrent conc

# Disaggregated: one prefill and one decode CUDA worker; KV moves P -> D over UCX, staged
# through host memory (the P's mirror is read in place by the local D).
kill "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
for role in prefill decode; do
  "$W" --role=$role --worker_id=cuda-$role "${COMMON[@]}" --port_file="$LOG/$role.port" \
    >"$LOG/$role.log" 2>&1 &
  pids+=($!)
done
wait_file "$LOG/prefill.port" && wait_file "$LOG/decode.port" || { tail "$LOG"/{prefill,decode}.log; exit 1; }
sleep 8  # the router drops the killed mixed worker after its heartbeat timeout
check pd_workers "$C" workers --router="$ROUTER"
check pd_generate gen 1,450,4996,17354,29871 32
check pd_long_prompt gen "$(seq -s, 100 900)" 16
check pd_concurrent conc
grep -h "kv_bytes\|received" "$LOG"/decode.log | tail -2
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
