#!/usr/bin/env bash
# Issue 31's measurements still missing after tp_serving_call.sh, in one device call on a 4-GPU
# machine (nvidia-h200-x4), each step in its own process group under its own time limit (a hang
# cannot eat the rest), one log a step, the logs tarred into $OUT/logs.tgz after every step:
#   A  ucx_gpu_test (UcxAgent mirror pin granules whole / 1 MiB / 16 MiB) on GPU 0, and at the
#      same time a UCX prefill + decode pair (8B, --ucx_mirror_pin_granule_mb=UCX_GRANULE_MB) on
#      GPUs 2 and 3: start to healthy, requests P -> D through the router;
#   B  multi_gpu_measure `tp8` with TPS=4 (8B TP=4 start to healthy with --dist_timeout_s=30)
#      and `tp70` (70B TP=4 start, concurrency 16 and 64);
#   C  `pd` (4 mixed TP=1 vs 2 P + 2 D, KV over NCCL) and `pdtp` (P TP=2 -> D TP=2 over NCCL);
#   D  8B TP=4 from a safetensors directory (tp_files_measure.sh), if time is left.
#
#   tests/gpu/tp_pd_call.sh BUNDLE_DIR MEASURE_SCRIPT LOG_DIR
#   tests/gpu/tp_pd_call.sh ucx_pd BUNDLE_DIR MEASURE_SCRIPT LOG_DIR GRANULE_MB P_GPU D_GPU
# MEASURE_SCRIPT: multi_gpu_measure.sh adapted by `tp_serving_call.sh adapt_measure`.
# BUNDLE_DIR: tests/gpu/bundle.sh with //kvtransfer/ucx:ucx_gpu_test tool//runtime:tandem_worker
#   tool//router:tandem_router tool//router:tandem_cli tool//tests/bench:tandem_bench
#   tool//runtime/model:make_dummy_model.
# Env: BUDGET_S (wall seconds for the whole script, default 420), UCX_GRANULE_MB (16), PHASES
#   (default "A B C D"; "U" alone: the UCX check and pairs with granules 0 and UCX_GRANULE_MB,
#   each pair limited to PAIR_S seconds), and the request counts below (cut from
#   multi_gpu_measure's to fit one call). Run from the repo root.
set -uo pipefail

if [[ ${1:-} == ucx_pd ]]; then
  B=$2 OUT=$4/ucxpd-g$5 G=$5
  # shellcheck source=/dev/null  # the adapted multi_gpu_measure.sh: functions only, no sections
  source "$3" "$B" "$OUT" ""
  start_router ucxpd || exit 1
  t0=$SECONDS
  for w in "up prefill $6" "ud decode $7"; do
    read -r name role gpu <<<"$w"
    start_worker "$name" "$role" --device="$gpu" --ucx_mirror_pin_granule_mb="$G" \
      --load_format=dummy --dummy_config=llama3-8b --kv_cache_bytes=0 \
      --gpu_memory_utilization=0.85 --max_model_len=8192
  done
  wait_healthy 2 || exit 1
  echo "ucx P/D pair (mirror pin granule $G MiB) healthy after $((SECONDS - t0)) s"
  grep -hoE "worker start: .*" "$OUT/up.log" "$OUT/ud.log"
  t1=$SECONDS
  bench "ucxpd-g$G" --num_requests=16 --warmup=1 --max_concurrency=4 --prompt_len=2048:4096 \
    --output_len=64
  echo "ucx P/D pair (granule $G MiB): the warmup request and 16 measured took $((SECONDS - t1)) s"
  grep -ihE "recompute|error|fail" "$OUT/up.log" "$OUT/ud.log" | head -8
  exit 0
fi

B=$(cd "${1:?bundle}" && pwd)
MEASURE=$(cd "$(dirname "${2:?adapted measure script}")" && pwd)/$(basename "$2")
LOG=${3:?log dir}
BUDGET=${BUDGET_S:-420}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export NCCL_DEBUG=VERSION
T0=$SECONDS
save() { [[ -n ${OUT:-} ]] && tar czf "$OUT/logs.tgz" -C "$(dirname "$LOG")" "$(basename "$LOG")"; }

# group SECS NAME CMD...: CMD in a session of its own, its log $LOG/NAME.log; after SECS (or
# when the budget ends) the whole process group is stopped (TERM, then KILL).
group() {
  local secs=$1 name=$2 t=$SECONDS
  shift 2
  local left=$((BUDGET - (SECONDS - T0) - 5))
  ((secs > left)) && secs=$left
  if ((secs < 20)); then
    echo "== $name: skipped, $left s of the budget left"
    return
  fi
  setsid "$@" >"$LOG/$name.log" 2>&1 &
  local pid=$! deadline=$((SECONDS + secs))
  while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid" 2>/dev/null
    sleep 3
    echo "== $name: stopped at its limit of $secs s"
  fi
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid"
  echo "== $name: rc $? in $((SECONDS - t)) s"
  save
}

echo "== $(nvidia-smi -L | wc -l) GPUs, $(nproc) cores, budget $BUDGET s"
group 20 env bash "$MEASURE" "$B" "$LOG/measure" env
grep -E "GPU[0-3] |NV[0-9]+|H200" "$LOG/env.log" | head -8

PHASES=" ${PHASES:-A B C D} "
# A: the granule check and a UCX P/D pair, side by side on separate GPUs. U: the same check
# beside two UCX pairs, granules 0 (GPUs 0, 1) and UCX_GRANULE_MB (GPUs 2, 3).
if [[ $PHASES == *" A "* || $PHASES == *" U "* ]]; then
  [[ $PHASES == *" U "* ]] && ucx_gpu=3 || ucx_gpu=0
  group 100 ucx_gpu_test env CUDA_VISIBLE_DEVICES="$ucx_gpu" TANDEM_REQUIRE_GPU=1 \
    "$B/bin/kvtransfer/ucx/ucx_gpu_test" &
  [[ $PHASES == *" U "* ]] && group "${PAIR_S:-100}" ucx_pd0 "$0" ucx_pd "$B" "$MEASURE" "$LOG" 0 0 1 &
  group "${PAIR_S:-100}" ucx_pd "$0" ucx_pd "$B" "$MEASURE" "$LOG" "${UCX_GRANULE_MB:-16}" 2 3 &
  wait
  grep -E "^\[ *(OK|FAILED|PASSED) |rror" "$LOG/ucx_gpu_test.log" | head -24
  cat "$LOG/ucx_pd.log" "$LOG/ucx_pd0.log" 2>/dev/null
fi
[[ $PHASES == *" B "* || $PHASES == *" C "* ]] || { save; exit 0; }

# B: group start with today's tree; 70B at concurrency 16 and 64 on the same group.
export HEALTH_POLLS=${HEALTH_POLLS:-300} DIST_TIMEOUT=${DIST_TIMEOUT:-30} WARMUP=${WARMUP:-1}
group 80 tp8 env TPS=4 N_B1="${N_B1:-4}" bash "$MEASURE" "$B" "$LOG/measure" tp8
group 120 tp70 env N70_B1="${N70_B1:-0}" N70_B16="${N70_B16:-32}" N70_B64="${N70_B64:-64}" \
  bash "$MEASURE" "$B" "$LOG/measure" tp70
# C: P/D tables (KV over NCCL).
export PD_N=${PD_N:-32} PD_WARMUP=${PD_WARMUP:-1}
group 140 pd bash "$MEASURE" "$B" "$LOG/measure" pd
group 80 pdtp env NPDTP_B1="${NPDTP_B1:-4}" bash "$MEASURE" "$B" "$LOG/measure" pdtp
for s in tp8 tp70 pd pdtp; do echo "== $s" && grep -vE "^$" "$LOG/$s.log" | head -30; done
# D: from files, only with time left for a write (~30 s) and a start.
if [[ $PHASES == *" D "* ]] && ((BUDGET - (SECONDS - T0) > 100)); then
  group 200 files env STEP_TIMEOUT=60 WRITE_THREADS="$(nproc)" tests/gpu/tp_files_measure.sh \
    "$B" "$LOG/files" 8b
  cat "$LOG/files.log"
fi
echo "== NCCL: $(grep -hoE "NCCL version [0-9.+a-z]*" "$LOG"/measure/*.log | sort | uniq -c | head -3)"
echo "== done in $((SECONDS - T0)) s"
save
