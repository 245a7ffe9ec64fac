#!/usr/bin/env bash
# Issue 31 items 1-2 on a 4-GPU machine (nvidia-h200-x4): write Llama-3-8B / Llama-3-70B bf16
# checkpoints with our own writer (make_dummy_model, shards written in parallel), then time a
# TP=4 group's start from those files: `tandem_worker --tp=4 --backend=cuda --model=DIR` through a
# router until healthy (page cache dropped first when the kernel lets us: a cold read), and
# `generate --tp=4 --model=DIR` to its first 8 tokens (files then in the page cache).
#
#   tests/gpu/tp_files_measure.sh BUNDLE_DIR LOG_DIR [8b] [70b]
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:tandem_worker tool//router:tandem_router
#   tool//router:tandem_cli tool//runtime:generate tool//runtime/model:make_dummy_model.
# Env: CKPT_ROOT (default: the largest of /tmp, /root, / by free space), WRITE_THREADS (default:
#   nproc), SHARD_MB (default 2048), STEP_TIMEOUT (seconds per step, default 240), WRITE_TIMEOUT
#   (the write's, default STEP_TIMEOUT), COLD (1, default: sync and drop the page cache before the
#   load; 0: keep it, a warm load with no sync), LOAD_AFTER (a file the load waits for, up to
#   STEP_TIMEOUT: other jobs using the GPUs during the write touch it when done), LAYERS (write
#   only the first N decoder layers of the 70B config, for a write that would not fit), CFG_70B,
#   BACKEND, NEED_GB and KV_CACHE_BYTES (default the 70B config, cuda, 150 GiB of free space and
#   0 = the GPU's share: a CPU rehearsal of the script passes a tiny config, cpu, 1 and a size),
#   HOST_PATH_TOO (models, e.g. "8b", whose group is started a second time with
#   --checkpoint_on_device=false: the fp32 host path, for a same-call comparison; the greedy tokens
#   of both are compared), SMOKE (1: after healthy, 16 greedy tokens through the router with
#   tandem_cli and a concurrency-1 tandem_bench row, 4 requests of 1024 in / 64 out).
# Each model's directory is removed after its runs (70B bf16 is ~141 GB). Run from the repo root.
set -uo pipefail
B=$(cd "${1:?bundle}" && pwd)
LOG=${2:?log dir}
shift 2
MODELS=${*:-8b 70b}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
W=$B/bin/runtime/tandem_worker R=$B/bin/router/tandem_router C=$B/bin/router/tandem_cli
G=$B/bin/runtime/generate M=$B/bin/runtime/model/make_dummy_model
STEP=${STEP_TIMEOUT:-240}
now() { date +%s.%N; }
since() { python3 -c "print('%.1f' % ($(now) - $1))"; }

pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  sleep 2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  pids=()
}
trap stop_all EXIT

free_gb() { df -BG --output=avail "$1" 2>/dev/null | tail -1 | tr -dc 0-9; }
if [[ -z ${CKPT_ROOT:-} ]]; then
  best=0
  for d in /tmp /root /; do
    g=$(free_gb "$d")
    [[ -n $g && $g -gt $best ]] && { best=$g; CKPT_ROOT=$d; }
  done
fi
CKPT_ROOT=${CKPT_ROOT%/}/tandem_ckpt
mkdir -p "$CKPT_ROOT"
echo "== machine: $(nproc) cores; $(free -g | awk '/Mem:/ {print $2 " GiB memory"}');" \
  "checkpoints under $CKPT_ROOT ($(free_gb "$CKPT_ROOT") GiB free)"
nvidia-smi -L | head -8

# The healthy group's smoke test: greedy tokens (saved to $LOG/NAME.tokens) and a short bench row.
smoke() {  # NAME ROUTER
  [[ ${SMOKE:-0} == 1 ]] || return 0
  local name=$1 router=$2 B=$B/bin/tests/bench/tandem_bench
  timeout 60 "$C" --insecure generate --router="$router" --prompt_ids=1,15,27,100,300,42 \
    --max_tokens=16 --ignore_eos >"$LOG/$name.tokens" 2>"$LOG/$name.tokens.err"
  echo "worker $name: greedy tokens rc=$? [$(cat "$LOG/$name.tokens")]"
  [[ -x $B ]] || return 0
  timeout 90 "$B" --router="$router" --rate=inf --num_requests=4 --max_concurrency=1 \
    --prompt_len=1024 --output_len=64 --warmup=1 --seed=7 --json >"$LOG/$name.bench" 2>&1
  echo "worker $name: tandem_bench c=1 rc=$? $(tail -1 "$LOG/$name.bench" | cut -c1-600)"
}

# Router + one TP=4 worker group from DIR (EXTRA worker flags after it); prints seconds to healthy.
worker_start() {  # NAME DIR [EXTRA...]
  local name=$1 dir=$2 t0 router
  shift 2
  rm -f "$LOG/$name-router.port" "$LOG/$name.port"
  "$R" --insecure --listen=127.0.0.1:0 --port_file="$LOG/$name-router.port" \
    >"$LOG/$name-router.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do [[ -s $LOG/$name-router.port ]] && break; sleep 0.1; done
  router=$(cat "$LOG/$name-router.port")
  t0=$(now)
  "$W" --insecure --role=mixed --worker_id="$name" --backend="${BACKEND:-cuda}" --router="$router" \
    --listen=127.0.0.1:0 --port_file="$LOG/$name.port" --tp=4 --model="$dir" \
    --kv_cache_bytes="${KV_CACHE_BYTES:-0}" --gpu_memory_utilization=0.85 --max_model_len=8192 \
    --dist_timeout_s=600 "$@" >"$LOG/$name.log" 2>&1 &
  pids+=($!)
  local deadline=$((SECONDS + STEP))
  while ((SECONDS < deadline)); do
    if "$C" --insecure workers --router="$router" --json 2>/dev/null | grep -q '"healthy":true'; then
      echo "worker $name: healthy $(since "$t0") s after the worker's start"
      grep -ohE "loaded the model in [0-9.a-z]+" "$LOG/$name.log" | sort | uniq -c | head -4
      grep -oE "(LoadModelWeights|StreamModelWeights16): rank .*" "$LOG/$name.log" | head -8
      grep -oE "[0-9:.]+ [0-9]+ [a-z_.]+:[0-9]+\] worker (start|group|.*serving).*" "$LOG/$name.log" |
        head -20
      smoke "$name" "$router"
      stop_all
      return 0
    fi
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.2
  done
  echo "worker $name: NOT healthy after $(since "$t0") s"
  grep -E "loaded the model in|(LoadModelWeights|StreamModelWeights16): rank|waits for" \
    "$LOG/$name.log" | tail -8
  tail -8 "$LOG/$name.log"
  stop_all
  return 1
}

for m in $MODELS; do
  case $m in
    8b) cfg=llama3-8b need=20 ;;
    70b) cfg=${CFG_70B:-$PWD/tests/gpu/configs/llama3-70b/config.json} need=${NEED_GB:-150} ;;
    *) echo "unknown model $m" && continue ;;
  esac
  dir=$CKPT_ROOT/$m
  rm -rf "$dir"
  if [[ $(free_gb "$CKPT_ROOT") -lt $need ]]; then
    echo "== $m: skipped, $(free_gb "$CKPT_ROOT") GiB free < $need GiB"
    continue
  fi
  echo "== $m"
  t0=$(now)
  if [[ -n ${LAYERS:-} && $m == 70b ]]; then
    sed -E "s/\"num_hidden_layers\": [0-9]+/\"num_hidden_layers\": $LAYERS/" "$cfg" >"$LOG/70b-$LAYERS.json"
    cfg=$LOG/70b-$LAYERS.json
    echo "70b: the first $LAYERS decoder layers only"
  fi
  timeout "${WRITE_TIMEOUT:-$STEP}" "$M" --config="$cfg" --out="$dir" --dtype=bfloat16 \
    --shard_mb="${SHARD_MB:-2048}" --threads="${WRITE_THREADS:-$(nproc)}" >"$LOG/write-$m.log" 2>&1
  rc=$?
  [[ ${COLD:-1} == 1 ]] && sync
  echo "write $m: rc=$rc $(since "$t0") s ($([[ ${COLD:-1} == 1 ]] && echo "sync included" ||
    echo "no sync")), $(du -sh "$dir" | cut -f1), $(ls "$dir" | grep -c safetensors$) shards;" \
    "$(grep -E '^(Dirty|Writeback|Shmem):' /proc/meminfo | tr -s ' ' | tr '\n' ' ')"
  [[ $rc -eq 0 ]] || { tail -3 "$LOG/write-$m.log"; rm -rf "$dir"; continue; }
  if [[ ${COLD:-1} != 1 ]]; then
    echo "page cache kept (COLD=0): the worker reads warm"
  elif sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo "page cache dropped: the worker reads cold"
  else
    echo "page cache NOT dropped (no permission): the worker reads warm"
  fi
  if [[ -n ${LOAD_AFTER:-} ]]; then
    t1=$(now)
    for _ in $(seq 1 $((STEP * 5))); do [[ -e $LOAD_AFTER ]] && break; sleep 0.2; done
    echo "waited $(since "$t1") s for $LOAD_AFTER"
  fi
  worker_start "files-$m-tp4" "$dir"
  if [[ " ${HOST_PATH_TOO:-} " == *" $m "* ]]; then
    worker_start "files-$m-tp4-host" "$dir" --checkpoint_on_device=false
    if [[ -s $LOG/files-$m-tp4.tokens ]] && cmp -s "$LOG/files-$m-tp4.tokens" "$LOG/files-$m-tp4-host.tokens"; then
      echo "$m: device-read and host-path groups gave the same greedy tokens"
    else
      echo "$m: greedy tokens DIFFER (or missing) between the device-read and host-path groups"
    fi
  fi
  [[ -x $G ]] || { echo "generate: not in the bundle, skipped"; rm -rf "$dir"; continue; }
  t0=$(now)
  timeout "$STEP" "$G" --backend=cuda --tp=4 --model="$dir" --prompt_ids=1,2,3 --max_tokens=8 \
    --kv_cache_bytes=4294967296 --num_threads=1 >"$LOG/generate-$m.out" 2>"$LOG/generate-$m.err"
  rc=$?
  echo "generate $m tp=4: rc=$rc, first 8 tokens after $(since "$t0") s (warm page cache)"
  grep -ohE "loaded the model in [0-9.a-z]+" "$LOG/generate-$m.err" | sort | uniq -c | head -4
  [[ $rc -eq 0 ]] || tail -3 "$LOG/generate-$m.err"
  rm -rf "$dir"
done
