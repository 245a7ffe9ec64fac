#!/usr/bin/env bash
# GPU serving smoke test: a real router and --backend=cuda workers (separate processes, loopback)
# serve requests through tandem_cli; the CUDA mixed worker must give the same greedy tokens as a
# CPU mixed worker is NOT expected (bf16 vs fp32), so this checks liveness, token counts, JSON
# timing fields and clean shutdown. With a UCX agent that accepts device memory it also runs
# one prefill + one decode CUDA worker (P -> D KV over UCX, staged through host memory), and on
# a machine with 2 GPUs a prefill worker on GPU 0 and a decode worker on GPU 1 with
# --kv_transport=nccl (device to device). The greedy tokens of the disaggregated runs must equal
# the mixed worker's for the same prompts (same kernels, same bf16 KV). Heterogeneous TP (P and
# D groups of different sizes, KV heads re-sharded in the read) over UCX with ranks sharing
# GPU 0, and over NCCL with one GPU per rank on a machine with >= 3 GPUs.
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
  else echo "FAIL $name (see $name.out)"; tail -n 5 "$LOG/$name.out"; failed=$((failed + 1)); fi
}
wait_file() { for _ in $(seq 1 600); do [[ -s $1 ]] && return 0; sleep 0.1; done; return 1; }

"$R" --insecure --listen=127.0.0.1:0 --port_file="$LOG/router.port" >"$LOG/router.log" 2>&1 &
pids+=($!)
wait_file "$LOG/router.port" || { echo "router did not start"; exit 1; }
ROUTER=$(cat "$LOG/router.port")
COMMON=(--backend=cuda --load_format=dummy --dummy_config=llama-100m --router="$ROUTER"
        --kv_cache_bytes=1073741824 --listen=127.0.0.1:0)
"$W" --insecure --role=mixed --worker_id=cuda-mixed "${COMMON[@]}" --port_file="$LOG/mixed.port" \
  >"$LOG/mixed.log" 2>&1 &
pids+=($!)
wait_file "$LOG/mixed.port" || { echo "mixed worker did not start"; tail "$LOG/mixed.log"; exit 1; }
sleep 2
check workers "$C" --insecure workers --router="$ROUTER"
gen() {  # prompt_ids, max_tokens, tag: the tokens go to $LOG/tokens.TAG
  "$C" --insecure generate --router="$ROUTER" --prompt_ids="$1" --max_tokens="$2" --ignore_eos --json \
    >"$LOG/gen.json" || return 1
  python3 - "$LOG/gen.json" "$2" "$LOG/tokens.$3" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
toks = j.get("token_ids") or j.get("tokens") or []
assert len(toks) == int(sys.argv[2]), j
open(sys.argv[3], "w").write(",".join(map(str, toks)) + "\n")
print(j)
PY
}
same_tokens() {  # run_a run_b: same greedy tokens for the short and the long prompt
  local len
  for len in short long; do
    cat "$LOG/tokens.$1_$len" "$LOG/tokens.$2_$len"
    cmp "$LOG/tokens.$1_$len" "$LOG/tokens.$2_$len" || return 1
  done
}
kv_moved() {  # decode worker's port file: it received KV over its agent, no load failed
  "$C" --insecure stats --worker="$(cat "$1")" --json >"$LOG/stats.json" || return 1
  python3 - "$LOG/stats.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
print({k: j[k] for k in ("kv_bytes_received", "kv_load_failures", "requests_finished")})
assert int(j["kv_bytes_received"]) > 0, j
assert int(j["kv_load_failures"]) == 0, j
PY
}
SHORT=1,450,4996,17354,29871
LONG=$(seq -s, 100 900)
check mixed_generate gen $SHORT 32 mixed_short
check mixed_long_prompt gen "$LONG" 16 mixed_long
# 16 concurrent requests (continuous batching + decode graphs).
conc() {
  local ps=()
  for i in $(seq 1 16); do
    "$C" --insecure generate --router="$ROUTER" --prompt_ids="$i,$((i+7)),$((i*3+11))" --max_tokens=24 \
      --ignore_eos --json >"$LOG/c$i.json" 2>&1 & ps+=($!)
  done
  for p in "${ps[@]}"; do wait "$p" || return 1; done
}
check mixed_concurrent conc

# Disaggregated: one prefill and one decode CUDA worker; KV moves P -> D over UCX, staged
# through host memory (the P's mirror is read in place by the local D).
kill "${pids[1]}" 2>/dev/null; wait "${pids[1]}" 2>/dev/null
for role in prefill decode; do
  "$W" --insecure --role=$role --worker_id=cuda-$role "${COMMON[@]}" --port_file="$LOG/$role.port" \
    >"$LOG/$role.log" 2>&1 &
  pids+=($!)
done
wait_file "$LOG/prefill.port" && wait_file "$LOG/decode.port" || { tail "$LOG"/{prefill,decode}.log; exit 1; }
sleep 8  # the router drops the killed mixed worker after its heartbeat timeout
check pd_workers "$C" --insecure workers --router="$ROUTER"
check pd_generate gen $SHORT 32 pd_short
check pd_long_prompt gen "$LONG" 16 pd_long
check pd_same_tokens_as_mixed same_tokens mixed pd
check pd_concurrent conc
check pd_kv_moved kv_moved "$LOG/decode.port"

# Heterogeneous TP over UCX on one GPU: P TP=2 -> D TP=1, then P TP=1 -> D TP=2 (a group's
# two ranks share GPU 0 over Gloo). Each D rank reads exactly its KV heads from the P ranks
# holding them with strided reads into its device pool (2D DMA from the P's mapped mirror):
# KV received, no load failure, no recompute fallback. bf16 TP=2 and TP=1 round differently,
# so tokens are not compared here (the f32 CPU tests compare them token for token).
kv_resharded() {  # decode worker's port file
  kv_moved "$1" || return 1
  python3 - "$LOG/stats.json" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).read())
assert int(j.get("kv_recomputes", 0)) == 0, j
PY
}
# One safetensors directory for every rank (dummy weights generated on the GPU differ between a
# single process and a group, so --load_format=dummy workers of different TP never pair).
MODEL_DIR=$LOG/llama-100m
"$B/bin/runtime/model/make_dummy_model" --config=llama-100m --dtype=bfloat16 --seed=1 \
  --out="$MODEL_DIR" >"$LOG/make_model.log" 2>&1 || echo "make_dummy_model failed"
HCOMMON=(--backend=cuda --model="$MODEL_DIR" --router="$ROUTER" --kv_cache_bytes=1073741824
         --listen=127.0.0.1:0)
share() { [[ $1 -gt 1 ]] && echo --tp_share_device; }
hetero() {  # tag, prefill tp, decode tp[, prefill device, decode device]: the last two = NCCL
  local tag=$1 ptp=$2 dtp=$3 p pflags=() dflags=()
  if [[ $# -ge 5 ]]; then  # one GPU per rank: rank r of a group on --device + r
    pflags=(--kv_transport=nccl --device="$4")
    dflags=(--kv_transport=nccl --device="$5")
  else
    pflags=($(share "$ptp"))
    dflags=($(share "$dtp"))
  fi
  for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  pids=("${pids[0]}")
  "$W" --insecure --role=prefill --worker_id=$tag-prefill "${HCOMMON[@]}" --tp="$ptp" "${pflags[@]}" \
    --port_file="$LOG/$tag-prefill.port" >"$LOG/$tag-prefill.log" 2>&1 &
  pids+=($!)
  "$W" --insecure --role=decode --worker_id=$tag-decode "${HCOMMON[@]}" --tp="$dtp" "${dflags[@]}" \
    --port_file="$LOG/$tag-decode.port" >"$LOG/$tag-decode.log" 2>&1 &
  pids+=($!)
  wait_file "$LOG/$tag-prefill.port" && wait_file "$LOG/$tag-decode.port" ||
    { tail "$LOG"/$tag-{prefill,decode}.log; return 1; }
  sleep 8  # the router drops the stopped workers after their heartbeat timeout
}
# The same over NCCL with one GPU per rank (>= 3 GPUs): P TP=2 on GPUs 0,1 -> D TP=1 on GPU 2,
# P TP=1 on GPU 0 -> D TP=2 on GPUs 1,2: the P ranks gather the head slices on the GPU, only the
# kept bytes cross NCCL.
shapes=("tp21 2 1" "tp12 1 2")
if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -ge 3 ]]; then
  shapes+=("nccl21 2 1 0 2" "nccl12 1 2 0 1")
else
  echo "SKIP nccl21_* nccl12_* (fewer than 3 GPUs)"
  skipped=$((skipped + 8))
fi
for shape in "${shapes[@]}"; do
  read -r tag ptp dtp pdev ddev <<<"$shape"
  if hetero "$tag" "$ptp" "$dtp" $pdev $ddev; then
    check ${tag}_generate gen $SHORT 32 ${tag}_short
    check ${tag}_long_prompt gen "$LONG" 16 ${tag}_long
    check ${tag}_concurrent conc
    check ${tag}_kv_resharded kv_resharded "$LOG/$tag-decode.port"
  else
    echo "FAIL ${tag}_start"; failed=$((failed + 1))
  fi
done

# Disaggregated over NCCL: prefill on GPU 0, decode on GPU 1 (NCCL needs one rank per GPU).
nccl_checks=(nccl_workers nccl_generate nccl_long_prompt nccl_same_tokens_as_mixed
             nccl_concurrent nccl_kv_moved)
if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU') -lt 2 ]]; then
  echo "SKIP ${nccl_checks[*]} (fewer than 2 GPUs)"
  skipped=$((skipped + ${#nccl_checks[@]}))
else
  for p in "${pids[@]:1}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  dev=0
  for role in prefill decode; do
    "$W" --insecure --role=$role --worker_id=nccl-$role "${COMMON[@]}" --device=$dev --kv_transport=nccl \
      --port_file="$LOG/nccl-$role.port" >"$LOG/nccl-$role.log" 2>&1 &
    pids+=($!)
    dev=$((dev + 1))
  done
  wait_file "$LOG/nccl-prefill.port" && wait_file "$LOG/nccl-decode.port" ||
    { tail "$LOG"/nccl-{prefill,decode}.log; exit 1; }
  sleep 8  # the router drops the UCX workers after their heartbeat timeout
  workers_nccl() {  # both NCCL workers serving, the stopped UCX ones no longer
    local w
    for _ in $(seq 1 40); do
      w=$("$C" --insecure workers --router="$ROUTER") || return 1
      if grep -q nccl-prefill <<<"$w" && grep -q nccl-decode <<<"$w" &&
         ! grep -qE '^cuda-.* serving ' <<<"$w"; then echo "$w"; return 0; fi
      sleep 0.5
    done
    echo "$w"; return 1
  }
  check nccl_workers workers_nccl
  check nccl_generate gen $SHORT 32 nccl_short
  check nccl_long_prompt gen "$LONG" 16 nccl_long
  check nccl_same_tokens_as_mixed same_tokens mixed nccl
  check nccl_concurrent conc
  check nccl_kv_moved kv_moved "$LOG/nccl-decode.port"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
