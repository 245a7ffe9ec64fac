#!/usr/bin/env bash
# Issue 38's FP8 lm_head (--quantize_lm_head) on one GPU (nvidia-h200), in two device calls:
#
#   OUT=DIR tests/gpu/fp8_lm_head_call.sh BUNDLE.tar.xz check   (~5 min)
#     the GPU tests (cuda_fp8_lm_head_test, convert_cuda_test), then decode_step_bench Llama-3-8B at batch 1 / 8 / 64 with bf16, FP8 and FP8 +
#     lm_head in one process, batch 1 twice more, a CUPTI trace of FP8 + lm_head at batch 1, and
#     Llama-3-70B FP8 vs FP8 + lm_head at batch 1;
#   OUT=DIR tests/gpu/fp8_lm_head_call.sh BUNDLE.tar.xz serve   (~6 min)
#     the lm_head cases of fp8_cuda_golden.sh (and its base_bf16 / llama_f32_gqa-fp8 /
#     tiny-dummy-fp8 neighbours: FP8 with a 16-bit head), then Llama-3-8B (dummy weights) served through tandem_router by one mixed CUDA worker, bf16, FP8
#     and FP8 + lm_head one after the other: tandem_bench 1024 in / 256 out at concurrency 1 (8
#     requests), Poisson 2 requests/s (32) and concurrency 64 (128); one summary line per run.
#
# BUNDLE.tar.xz: a tar of directory gb/ made by tests/gpu/bundle.sh gb
# //runtime/cuda:cuda_fp8_lm_head_test //kernels/layers/cuda:convert_cuda_test
# tool//runtime/cuda:decode_step_bench tool//runtime:generate tool//runtime:tandem_worker
# tool//router:tandem_router tool//router:tandem_cli tool//tests/bench:tandem_bench, binaries
# stripped, xz-compressed (the carried tree stays under 64 MiB). Logs in $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/b && tar -xJf "${1:?bundle .tar.xz}" -C /tmp/b
B=/tmp/b/gb
BIN=$B/bin
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
L=$OUT/logs
mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader

if [[ ${2:?check or serve} == check ]]; then
  for t in runtime/cuda/cuda_fp8_lm_head_test kernels/layers/cuda/convert_cuda_test; do
    timeout 300 "$BIN/$t" > "$L/$(basename $t).log" 2>&1
    echo "$(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/$(basename $t).log" | tr '\n' ' ')"
  done
  DSB=$BIN/runtime/cuda/decode_step_bench
  timeout 240 "$DSB" --shape=8b --batches=1,8,64 --context=1024 --steps=48 \
    --quantization=none,fp8,fp8_lm_head > "$L/dsb8b.log" 2>&1
  echo "8b rc=$?"
  grep -E "shapes|^ *batch|^ *[0-9]+ " "$L/dsb8b.log" | head -40
  for r in 2 3; do
    timeout 120 "$DSB" --shape=8b --batches=1 --context=1024 --steps=48 \
      --quantization=none,fp8,fp8_lm_head > "$L/dsb8b_b1_$r.log" 2>&1
    echo "8b batch 1 round $r rc=$?"
    grep -E "shapes|^ *1 " "$L/dsb8b_b1_$r.log" | head -12
  done
  timeout 120 "$DSB" --shape=8b --batches=1 --context=1024 --steps=48 --quantization=fp8_lm_head \
    --trace=1 > "$L/dsb8b_trace.log" 2>&1
  echo "trace rc=$?"
  tail -n 30 "$L/dsb8b_trace.log"
  timeout 240 "$DSB" --shape=70b --batches=1 --context=1024 --steps=32 \
    --quantization=fp8,fp8_lm_head > "$L/dsb70b.log" 2>&1
  echo "70b rc=$?"
  grep -E "shapes|^ *1 " "$L/dsb70b.log" | head -12
else
  if [[ -x $BIN/runtime/cuda/cuda_fp8_lm_head_test ]]; then  # when the bundle carries it
    timeout 120 "$BIN/runtime/cuda/cuda_fp8_lm_head_test" > "$L/cuda_fp8_lm_head_test.log" 2>&1
    echo "cuda_fp8_lm_head_test rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/cuda_fp8_lm_head_test.log" | tr '\n' ' ')"
  fi
  ONLY='lm_head|^base_bf16$|^llama_f32_gqa-fp8$|^tiny-dummy-fp8$' timeout 300 \
    tests/gpu/fp8_cuda_golden.sh "$B" "$L/golden" > "$L/golden.log" 2>&1
  echo "fp8_cuda_golden rc=$?: $(tail -n 1 "$L/golden.log")"
  grep -E "^(PASS|FAIL)|failures" "$L/golden.log" | head -20
  source tests/gpu/serve_lib.sh
  serve() {  # TAG QUANT_FLAGS...
    local tag=$1 dir=$L/$1 router
    shift
    if serve_start "$dir" 0 "$tag" TANDEM_DUMMY=1 -- --worker_id="w-$tag" --load_format=dummy \
      --dummy_config=llama3-8b "$@" --kv_cache_bytes=20000000000 --max_model_len=4096; then
      router=$SERVE_ROUTER
      timeout 40 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf --max_concurrency=1 \
        --num_requests=8 --prompt_len=1024 --output_len=256 --warmup=1 --seed=301 --json \
        > "$dir/c1.json" 2> "$dir/c1.err"
      echo "$tag c1 rc=$?"
      timeout 60 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=2 --num_requests=32 \
        --prompt_len=1024 --output_len=256 --warmup=1 --seed=302 --json \
        > "$dir/r2.json" 2> "$dir/r2.err"
      echo "$tag rate2 rc=$?"
      timeout 60 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf \
        --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 \
        --seed=303 --json > "$dir/c64.json" 2> "$dir/c64.err"
      echo "$tag c64 rc=$?"
    fi
    serve_stop
  }
  serve bf16 --quantization=
  serve fp8 --quantization=fp8
  serve fp8_lm_head --quantization=fp8 --quantize_lm_head
  bench_summary "$L"/*/c1.json "$L"/*/r2.json "$L"/*/c64.json
  grep -h -i "error\|fail" "$L"/*/worker.log | head -5
fi
cd "$OUT" && tar -czf logs.tgz logs && rm -rf logs
