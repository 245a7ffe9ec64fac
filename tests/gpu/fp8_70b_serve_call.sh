#!/usr/bin/env bash
# Issue 38's serving row and decode / GEMM tables in ONE device call on nvidia-h200-x4
# (kernels/fp8/BENCHMARKS.md, "Llama-3-70B FP8 at TP=2 through the router"), jobs in parallel:
#   GPUs 0, 1: Llama-3-70B (configs/llama3-70b) TP=2, device dummy weights quantized at load
#     (--quantization=fp8: per-channel e4m3, dynamic per-token activations), one mixed
#     tandem_worker behind a tandem_router; tandem_bench 1024 in / OUT_LEN out at concurrency 64
#     (N64 requests), then 256 (N256), no warm-up requests.
#   GPU 2: decode_step_bench, Llama-3-8B bf16 then FP8 (batches 1 / 8 / 64); GPU 3:
#     fp8_cuda_bench --only=gemm and scaled_mm_bench.py (torch._scaled_mm) at the same shapes;
#   then GPUs 2, 3: the same 70B group in bf16 at concurrency 64 (the ratio), then
#     decode_step_bench --shape=70b --tp=2 FP8 and bf16 while time is left.
#
#   tests/gpu/fp8_70b_serve_call.sh BUNDLE.tar.xz   (on the device, $OUT set; repository root)
# BUNDLE: tests/gpu/bundle.sh with //runtime/cuda:decode_step_bench //kernels/fp8:fp8_cuda_bench
#   tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
#   tool//tests/bench:tandem_bench, tar'd and xz'd. Env: DEADLINE (seconds from the start,
#   default 130: every step's timeout is cut to what is left), OUT_LEN (1024), N64 (64), N256
#   (256), PART=c256 (only the concurrency-256 rows: FP8 on GPUs 0, 1 and bf16 on GPUs 2, 3 side by
#   side, e.g. after a KV-pool sizing change). Logs: $OUT/logs.tgz; the summary is printed last.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/gpu/device_call_lib.sh
source "$HERE/device_call_lib.sh"
# shellcheck source=tests/gpu/moe_serve_lib.sh
source "$HERE/moe_serve_lib.sh"  # moe_bench_lines
T0=$SECONDS
DEADLINE=${DEADLINE:-130}
B=/tmp/fp8_70b_bundle
bundle_call_start "${1:?bundle .tar.xz}" "$B"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
CONFIG=$HERE/configs/llama3-70b/config.json
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem --format=csv >>"$LOG/gpus.txt"
left() { echo $((DEADLINE - (SECONDS - T0))); }
note() { echo "$* (at $((SECONDS - T0)) s)" | tee -a "$LOG/summary.txt"; }

# serve70 TAG DEVICE CONCURRENCIES WORKER_FLAGS...: router + one TP=2 mixed worker on GPUs
# DEVICE and DEVICE + 1, then tandem_bench at each concurrency; logs under $LOG/TAG.
serve70() {
  local tag=$1 dev=$2 concs=$3 d=$LOG/$1 pids=() router up=0 c n t
  shift 3
  mkdir -p "$d"
  "$B/bin/router/tandem_router" --insecure --listen=127.0.0.1:0 --port_file="$d/router.port" \
    >"$d/router.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do [[ -s $d/router.port ]] && break; sleep 0.1; done
  router=$(cat "$d/router.port")
  "$B/bin/runtime/tandem_worker" --insecure --role=mixed --worker_id="$tag" --backend=cuda \
    --router="$router" --listen=127.0.0.1:0 --port_file="$d/worker.port" --tp=2 --device="$dev" \
    --load_format=dummy --dummy_config="$CONFIG" --kv_cache_bytes=0 \
    --gpu_memory_utilization=0.92 --max_model_len=4096 "$@" >"$d/worker.log" 2>&1 &
  pids+=($!)
  t=$SECONDS
  while (($(left) > 5)) && kill -0 "${pids[1]}" 2>/dev/null; do
    "$B/bin/router/tandem_cli" --insecure workers --router="$router" --json >"$d/workers.json" \
      2>/dev/null
    if grep -q '"healthy":true' "$d/workers.json"; then
      up=1
      break
    fi
    sleep 0.5
  done
  note "$tag: healthy=$up after $((SECONDS - t)) s"
  for c in $concs; do
    [[ $up == 1 ]] || break
    n=$c
    [[ $c == 64 ]] && n=${N64:-64}
    [[ $c == 256 ]] && n=${N256:-256}
    t=$(left)
    ((t > 10)) || break
    timeout "$t" "$B/bin/tests/bench/tandem_bench" --router="$router" --rate=inf \
      --num_requests="$n" --max_concurrency="$c" --prompt_len=1024 --output_len="${OUT_LEN:-1024}" \
      --warmup=0 --seed=$((38 + c)) --json >"$d/c$c.json" 2>"$d/c$c.err"
    note "$tag c$c: rc=$? n=$n"
  done
  # SIGTERM drains the requests in flight (a bench cut by its timeout leaves some): then SIGKILL
  # (the worker's other rank follows its parent, PR_SET_PDEATHSIG).
  kill "${pids[@]}" 2>/dev/null
  for _ in $(seq 1 30); do kill -0 "${pids[@]}" 2>/dev/null || break; sleep 0.1; done
  kill -9 "${pids[@]}" 2>/dev/null
  wait "${pids[@]}" 2>/dev/null
}

step_on() {  # NAME GPUS CMD...: CMD on CUDA_VISIBLE_DEVICES=GPUS under what is left, line-buffered
  local name=$1 gpus=$2 t
  shift 2
  t=$(left)
  ((t > 5)) || { note "$name: not run (no time left)"; return; }
  CUDA_VISIBLE_DEVICES=$gpus PYTHONUNBUFFERED=1 timed_step "$name.txt" "$t" stdbuf -oL "$@"
  note "$name: rc $step_rc in $step_secs s"
}

if [[ ${PART:-all} == c256 ]]; then
  serve70 fp8 0 "256" --quantization=fp8 &
  serve70 bf16 2 "256" &
  wait
  echo "== summary"
  cat "$LOG/summary.txt"
  grep -h "KV\|kv_cache\|blocks" "$LOG"/*/worker.log | grep -vi warn | head -6
  moe_bench_lines "$LOG"/fp8/c*.json "$LOG"/bf16/c*.json
  (cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
  exit 0
fi
serve70 fp8 0 "64 256" --quantization=fp8 &
fp8_pid=$!
D=$B/bin/runtime/cuda/decode_step_bench
step_on decode8b 2 "$D" --batches=1,8,64 --quantization=none,fp8 --steps=32 &
d8_pid=$!
(
  step_on gemm 3 "$B/bin/kernels/fp8/fp8_cuda_bench" --only=gemm --gemm_iters=10
  step_on scaled_mm 3 python3 "$HERE/../../kernels/fp8/scaled_mm_bench.py" --iters 10
) &
gemm_pid=$!
wait "$d8_pid" "$gemm_pid"
serve70 bf16 2 "64"
step_on decode70b 2,3 "$D" --shape=70b --tp=2 --batches=1,8,64 --quantization=fp8,none --steps=16
wait "$fp8_pid"

echo "== summary"
cat "$LOG/summary.txt"
moe_bench_lines "$LOG"/fp8/c*.json "$LOG"/bf16/c*.json
cat "$LOG/decode8b.txt" "$LOG/decode70b.txt" 2>/dev/null | grep -vE "^(I|W|E)[0-9]{4}" | tail -40
tail -30 "$LOG/gemm.txt"
tail -26 "$LOG/scaled_mm.txt"
(cd "$OUT" && tar czf logs.tgz logs && rm -rf logs)
