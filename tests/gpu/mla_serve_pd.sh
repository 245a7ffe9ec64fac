#!/usr/bin/env bash
# DeepSeek MLA served on CUDA workers with the latent KV moving P -> D (issue 33, item 5): a real
# router and --backend=cuda workers on loopback serve the deepseek_v3_f32 golden fixture (bf16 on
# the GPU). A mixed worker gives the reference greedy tokens; then one prefill + one decode
# worker on GPU 0 with the latent blocks over UCX (staged through host memory), then prefill on
# GPU 0 and decode on GPU 1 over NCCL (device to device): their tokens must equal the mixed
# worker's (same kernels, same bf16 latent), the decode worker must have received KV bytes with
# no load failure. With >= 3 GPUs also P TP=2 (GPUs 0, 1) -> D TP=1 (GPU 2) over NCCL: every P
# rank holds the whole latent, so the D rank reads it from one of them (no re-sharding); bf16
# TP=2 rounds differently from TP=1, so that shape checks tokens counts, KV received and no
# recompute fallback rather than equal tokens.
# KV_CACHE_DTYPE=fp8 (env): every worker, the mixed reference included, keeps the latent in FP8
# (--kv_cache_dtype=fp8; each block one range, its codes then its row scales: runtime/engine/
# kv_layout.h Fp8LatentBlocks), so the FP8 blocks move P -> D and D's tokens must equal the mixed
# FP8 worker's. PD_STAGES (env, default "ucx nccl nccl21"): the P -> D stages to run after the
# mixed reference (several instances may run at once, each with its own router, on other GPUs).
# MODEL (env): another checkpoint directory, e.g. a GQA model whose K / V then move in FP8 with
# KV_CACHE_DTYPE=fp8 (one scale per tensor: tests/gpu/fp8_kv_cuda_golden.sh builds head_dim-64
# fixtures; the prompts' token ids stay below 512).
#
#   [KV_CACHE_DTYPE=fp8] [PD_STAGES="ucx"] [MODEL=DIR] tests/gpu/mla_serve_pd.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:tandem_worker tool//router:tandem_router
# tool//router:tandem_cli. Run from the repository root. Prints "N passed, N failed, N skipped".
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0
W=$B/bin/runtime/tandem_worker R=$B/bin/router/tandem_router C=$B/bin/router/tandem_cli
MODEL=${MODEL:-tests/golden/fixtures_mla/deepseek_v3_f32}
KV_CACHE_DTYPE=${KV_CACHE_DTYPE:-auto}
PD_STAGES=" ${PD_STAGES:-ucx nccl nccl21} "
passed=0 failed=0 skipped=0
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT
check() {  # NAME CMD...
  local name=$1; shift
  if "$@" >"$LOG/$name.out" 2>&1; then echo "PASS $name"; passed=$((passed + 1));
  else echo "FAIL $name (see $name.out)"; tail -n 5 "$LOG/$name.out"; failed=$((failed + 1)); fi
}
wait_file() { for _ in $(seq 1 600); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
[[ $gpus -ge 1 ]] || { echo "no GPU: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0; }

"$R" --insecure --listen=127.0.0.1:0 --port_file="$LOG/router.port" >"$LOG/router.log" 2>&1 &
pids+=($!)
wait_file "$LOG/router.port" || { echo "router did not start"; exit 1; }
ROUTER=$(cat "$LOG/router.port")
# Eager decode (--cuda_graphs=false): the check is the latent's journey, and workers start faster.
COMMON=(--insecure --backend=cuda --model="$MODEL" --router="$ROUTER" --kv_cache_bytes=67108864
        --cuda_graphs=false --listen=127.0.0.1:0 --kv_cache_dtype="$KV_CACHE_DTYPE")
start() {  # TAG ROLE FLAGS...: a worker; waits for its port file
  local tag=$1 role=$2; shift 2
  "$W" --role="$role" --worker_id="$tag-$role" "${COMMON[@]}" "$@" \
    --port_file="$LOG/$tag-$role.port" >"$LOG/$tag-$role.log" 2>&1 &
  pids+=($!)
  wait_file "$LOG/$tag-$role.port" || { tail -n 5 "$LOG/$tag-$role.log"; return 1; }
}
stop_workers() {  # every worker (not the router), then the router's heartbeat timeout
  for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=("${pids[0]}")
  sleep 8
}
gen() {  # PROMPT_IDS MAX_TOKENS TAG: the tokens go to $LOG/tokens.TAG
  "$C" --insecure generate --router="$ROUTER" --prompt_ids="$1" --max_tokens="$2" --ignore_eos \
    --json >"$LOG/gen.json" || return 1
  python3 - "$LOG/gen.json" "$2" "$LOG/tokens.$3" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
toks = j.get("token_ids") or j.get("tokens") or []
assert len(toks) == int(sys.argv[2]), j
open(sys.argv[3], "w").write(",".join(map(str, toks)) + "\n")
print(j)
PY
}
same_tokens() {  # A B: the same greedy tokens for the short and the long prompt
  cat "$LOG/tokens.$1_short" "$LOG/tokens.$2_short" "$LOG/tokens.$1_long" "$LOG/tokens.$2_long"
  cmp "$LOG/tokens.$1_short" "$LOG/tokens.$2_short" && cmp "$LOG/tokens.$1_long" "$LOG/tokens.$2_long"
}
kv_moved() {  # PORT_FILE of a decode worker: KV received, no load failure, no recompute
  "$C" --insecure stats --worker="$(cat "$1")" --json >"$LOG/stats.json" || return 1
  python3 - "$LOG/stats.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
print({k: j.get(k) for k in ("kv_bytes_received", "kv_load_failures", "kv_recomputes")})
assert int(j["kv_bytes_received"]) > 0 and int(j["kv_load_failures"]) == 0, j
assert int(j.get("kv_recomputes", 0)) == 0, j
PY
}
SHORT=5,17,301,42,99,7
LONG=$(python3 -c "print(','.join(str(3 + (i * 37) % 500) for i in range(200)))")
run_pair() {  # TAG: generate the short and the long prompt into tokens.TAG_{short,long}
  check "$1_generate" gen "$SHORT" 16 "$1_short" && check "$1_long_prompt" gen "$LONG" 12 "$1_long"
}

start ref mixed || exit 1
sleep 2
run_pair mixed
stop_workers
# P -> D over UCX, both on GPU 0.
if [[ $PD_STAGES != *" ucx "* ]]; then
  :
elif start ucx prefill && start ucx decode; then
  sleep 2
  run_pair ucx
  check ucx_same_tokens_as_mixed same_tokens mixed ucx
  check ucx_kv_moved kv_moved "$LOG/ucx-decode.port"
else
  echo "FAIL ucx_start"; failed=$((failed + 1))
fi
[[ $PD_STAGES == *" ucx "* ]] && stop_workers
if [[ $PD_STAGES != *" nccl "* ]]; then
  :
elif [[ $gpus -lt 2 ]]; then
  echo "SKIP nccl_* (fewer than 2 GPUs)"; skipped=$((skipped + 1))
elif start nccl prefill --kv_transport=nccl --device=0 &&
     start nccl decode --kv_transport=nccl --device=1; then
  sleep 2
  run_pair nccl
  check nccl_same_tokens_as_mixed same_tokens mixed nccl
  check nccl_kv_moved kv_moved "$LOG/nccl-decode.port"
else
  echo "FAIL nccl_start"; failed=$((failed + 1))
fi
[[ $PD_STAGES == *" nccl "* && $PD_STAGES == *" nccl21 "* ]] && stop_workers
if [[ $PD_STAGES != *" nccl21 "* ]]; then
  :
elif [[ $gpus -lt 3 ]]; then
  echo "SKIP nccl21_* (fewer than 3 GPUs)"; skipped=$((skipped + 1))
elif start nccl21 prefill --kv_transport=nccl --device=0 --tp=2 &&
     start nccl21 decode --kv_transport=nccl --device=2; then
  sleep 2
  run_pair nccl21
  check nccl21_kv_moved kv_moved "$LOG/nccl21-decode.port"
else
  echo "FAIL nccl21_start"; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
