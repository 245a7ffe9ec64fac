#!/usr/bin/env bash
# One device call on nvidia-h200-x4 (4 GPUs, 64 cores, 512 GiB) for issue 31's last start target
# and the real-size MoE / MLA rows of issues 32 / 33, from the repository root:
#   tests/gpu/tp70_files_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh .. //runtime/cuda:decode_step_bench
#   tool//runtime/model:make_dummy_model tool//runtime:tandem_worker tool//router:tandem_router
#   tool//router:tandem_cli tool//tests/bench:tandem_bench, tarred and xz-compressed.
# While make_dummy_model writes Llama-3-70B bf16 (hub-like ~4.7 GB shards, cores LANE_CORES.. of the
# machine left to it), four lanes use the GPUs on LANE_CORES cores:
#   GPU 0     decode_step_bench --shape=qwen3-30b-a3b --batches=1,8,64 --context=1024
#   GPU 1     decode_step_bench --shape=deepseek-v2-lite (same batches), then serving it through a
#             router: tandem_bench 1024 in / 256 out at concurrency 1 and 16
#   GPUs 2,3  serve_pd_kv_bench.sh over NCCL: DeepSeek-V2-Lite, then Llama-3-8B (KV bytes / token)
# then, the lanes done, tp_files_measure.sh starts `tandem_worker --tp=4 --model=DIR` through a
# router from the written files (page cache kept: COLD=0) and prints the ranks' load phases.
# Env: CKPT_ROOT (default /dev/shm when it has >= 150 GiB free, else tp_files_measure.sh's
# choice), WRITE_TIMEOUT / LOAD_TIMEOUT / LANE_TIMEOUT (seconds; defaults 90 / 180 / 55: the
# 2026-11-28 call wrote in 67.9 s, its lanes took 7-20 s, and no rank had loaded after 69 s),
# LAYERS, BACKEND and MODEL_CFG
# (a CPU rehearsal: BACKEND=cpu with a tiny config; the lanes then use the CPU backend and
# MODEL_CFG too, PD_TRANSPORT=ucx; decode_step_bench fails without a GPU). Logs: $OUT/logs.tar.gz
# + summary.txt.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/tp70_out}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/tp70_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
BACKEND=${BACKEND:-cuda}
LANES=${LANE_CORES:-0-7}
NCPU=$(nproc)
{
  echo "extracted in $((SECONDS - T0)) s; $NCPU cores; $(free -g | awk '/Mem:/ {print $2}') GiB"
  nvidia-smi -L 2>&1 | head -4
  nvidia-smi topo -m 2>&1 | head -6
  df -h /dev/shm /tmp 2>&1
  echo "vm.dirty_ratio $(cat /proc/sys/vm/dirty_ratio) background $(cat \
    /proc/sys/vm/dirty_background_ratio)"
  for t in nsys ncu compute-sanitizer; do [[ -x /usr/local/cuda/bin/$t ]] && echo -n "$t "; done
  echo "(under /usr/local/cuda/bin)"
} | tee "$LOG/machine.txt"
if [[ -z ${CKPT_ROOT:-} ]]; then
  shm=$(df -BG --output=avail /dev/shm 2>/dev/null | tail -1 | tr -dc 0-9)
  [[ -n $shm && $shm -ge 150 ]] && export CKPT_ROOT=/dev/shm
fi
echo "checkpoint root: ${CKPT_ROOT:-the largest disk (tp_files_measure.sh)}"

BIN=$BD/bin
lane() {  # NAME SECONDS GPUS CMD...: in the background on the lane cores, output to $LOG/NAME.txt
  local name=$1 secs=$2 gpus=$3
  shift 3
  (
    t=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpus timeout "$secs" taskset -c "$LANES" "$@" >"$LOG/$name.txt" 2>&1
    echo "$? $((SECONDS - t))" >"$LOG/$name.rc"
  ) &
}
dsb() { "$BIN/runtime/cuda/decode_step_bench" --batches=1,8,64 --context=1024 --steps=32 "$@"; }
dummy() { [[ $BACKEND == cuda ]] && echo "$1" || echo "${MODEL_CFG:?MODEL_CFG}"; }

# Router + one mixed worker on the lane's GPU, then tandem_bench at concurrency 1 and 16.
serve() {
  local dir=$LOG/serve router up=0 pids=()
  mkdir -p "$dir"
  "$BIN/router/tandem_router" --insecure --listen=127.0.0.1:0 --port_file="$dir/router.port" \
    >"$dir/router.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 100); do [[ -s $dir/router.port ]] && break; sleep 0.1; done
  router=$(cat "$dir/router.port")
  "$BIN/runtime/tandem_worker" --insecure --role=mixed --worker_id=v2lite --backend="$BACKEND" \
    --load_format=dummy --dummy_config="$(dummy deepseek-v2-lite)" --router="$router" \
    --max_model_len=4096 --listen=127.0.0.1:0 --port_file="$dir/worker.port" \
    >"$dir/worker.log" 2>&1 &
  pids+=($!)
  local t0=$SECONDS
  for _ in $(seq 1 150); do
    "$BIN/router/tandem_cli" --insecure workers --router="$router" --json 2>/dev/null |
      grep -q '"healthy":true' && { up=1; break; }
    sleep 0.2
  done
  echo "worker healthy=$up after $((SECONDS - t0)) s"
  local c n
  for c in 1 16; do
    [[ $up == 1 ]] || break
    n=$((c == 1 ? 4 : 16))
    "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf --num_requests=$n \
      --max_concurrency=$c --prompt_len=1024 --output_len=256 --warmup=1 --seed=$((300 + c)) \
      --json >"$dir/c$c.json" 2>"$dir/c$c.err"
    echo "c$c: rc=$? n=$n $(cat "$dir/c$c.json")"
  done
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}
v2lite() {
  dsb --shape=deepseek-v2-lite
  echo "decode rc=$?"
  serve
}
pd() {
  local m
  for m in deepseek-v2-lite llama3-8b; do
    echo "== $m"
    TRANSPORTS=${PD_TRANSPORT:-nccl} BACKEND=$BACKEND tests/gpu/serve_pd_kv_bench.sh "$BD" "$LOG/pd-$m" \
      "$(dummy "$m")" 1024,4096 4
  done
}
export -f serve v2lite pd dummy dsb
export BIN BACKEND LOG BD MODEL_CFG="${MODEL_CFG:-}" PD_TRANSPORT="${PD_TRANSPORT:-nccl}"
LANE_S=${LANE_TIMEOUT:-55}
lane qwen3 "$LANE_S" 0 bash -c "dsb --shape=qwen3-30b-a3b"
lane v2lite "$LANE_S" 1 bash -c v2lite
lane pd "$LANE_S" 2,3 bash -c pd
(  # the lanes are the parent's jobs: watch their .rc files
  for n in qwen3 v2lite pd; do until [[ -e $LOG/$n.rc ]]; do sleep 0.2; done; done
  touch "$LOG/lanes.done"
) &

# The write on the other cores, then the TP=4 start once the lanes are done.
writer_cores=$((${LANES#*-} + 1))-$((NCPU - 1))
COLD=0 LOAD_AFTER=$LOG/lanes.done STEP_TIMEOUT=${LOAD_TIMEOUT:-180} \
  WRITE_TIMEOUT=${WRITE_TIMEOUT:-90} WRITE_THREADS=$((NCPU - ${LANES#*-} - 1)) SHARD_MB=4700 \
  NEED_GB=${NEED_GB:-150} BACKEND=$BACKEND CFG_70B=${MODEL_CFG:-} KV_CACHE_BYTES=${KV_CACHE_BYTES:-0} \
  taskset -c "$writer_cores" tests/gpu/tp_files_measure.sh "$BD" "$LOG/files" 70b \
  2>&1 | tee "$LOG/files.txt"
wait

{
  cat "$LOG/machine.txt"
  echo "== 70B from files (cores $writer_cores)"
  cat "$LOG/files.txt"
  for n in qwen3 v2lite pd; do
    read -r rc secs <"$LOG/$n.rc" || { rc='?'; secs='?'; }
    echo "== $n: rc $rc in $secs s"
    grep -vE "^(I|W)[0-9]{4} |^$" "$LOG/$n.txt" | grep -E "batch|tok|rc=|healthy|c1|c16|==|^(nccl|ucx) |MiB|ms" |
      cut -c1-1500 | head -40
  done
  echo "== total $((SECONDS - T0)) s"
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
