#!/usr/bin/env bash
# Llama-3-70B FP8 (online --quantization=fp8: per-channel weights, per-token activations) at TP=2
# through a router on nvidia-h200-x2, one decode-GEMM choice after the other on GPUs 0,1
# (TANDEM_FP8_DECODE_GEMM, runtime/cuda/cuda_fp8_linear.h; kernels/fp8/BENCHMARKS.md, twenty-fourth
# session). One mixed worker a choice, tandem_bench 1,024-token prompts at each concurrency.
#
#   tests/gpu/fp8_70b_tp2_ab_call.sh PART.tar.xz   (on the device, $OUT set; repository root)
#
# The bundle (tests/gpu/bundle.sh with tool//runtime:tandem_worker tool//router:tandem_router
# tool//router:tandem_cli tool//tests/bench:tandem_bench) is larger than the device tool's 64 MiB
# with the tree, so it travels in two parts on one warm machine: a first call extracts the part
# without the worker (lib/, bin/router, bin/tests) into $BD (default /tmp/b24e), this script's
# argument is the worker's part (bin/runtime/tandem_worker), extracted beside it.
# Env: MODES ("gemv auto"), CONCS ("16 64"; requests: 2 x concurrency below 64, else concurrency),
# OUT_LEN (512), BENCH_S (60, each bench's timeout). Logs: $OUT/logs.tar.gz; summary printed.
set -uo pipefail
source tests/gpu/device_call_lib.sh
BD=${BD:-/tmp/b24e}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
[[ -d $BD/lib ]] || { echo "FAIL: $BD/lib missing (the first part was not extracted, or the machine went cold)"; exit 1; }
tar xJf "$(realpath "$1")" -C "$BD" || { echo "FAIL extract"; exit 1; }
nvidia-smi -L > "$LOG/gpus.txt" 2>&1
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
BIN=$BD/bin
# shellcheck source=tests/gpu/serve_lib.sh
source tests/gpu/serve_lib.sh
CONFIG=$PWD/tests/gpu/configs/llama3-70b/config.json
{
  device_line
  for g in ${MODES:-gemv auto}; do
    d=$LOG/$g
    serve_start "$d" 0,1 "$g" TANDEM_FP8_DECODE_GEMM="$g" -- --worker_id="70b-$g" --tp=2 \
      --load_format=dummy --dummy_config="$CONFIG" --kv_cache_bytes=0 \
      --gpu_memory_utilization=0.92 --max_model_len=4096 --quantization=fp8
    for c in ${CONCS:-16 64}; do
      n=$((c * 2))
      ((c >= 64)) && n=$c
      timeout "${BENCH_S:-60}" "$BIN/tests/bench/tandem_bench" --router="$SERVE_ROUTER" --rate=inf \
        --num_requests="$n" --max_concurrency="$c" --prompt_len=1024 --output_len="${OUT_LEN:-512}" \
        --warmup=0 --seed=$((38 + c)) --json > "$d/c$c.json" 2> "$d/c$c.err"
      echo "$g c$c rc=$?"
    done
    serve_stop
  done
  bench_summary "$LOG"/*/c*.json
} 2>&1 | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$OUT/logs"
