#!/usr/bin/env bash
# Issue 38's weight-only FP8 GEMV at 2-8 tokens (kernels/fp8/fp8_w8a16_tokens_cuda.cu) on one GPU
# (nvidia-h200), in two device calls:
#
#   OUT=DIR tests/gpu/fp8_w16_tokens_call.sh BUNDLE.tar.xz check   (~6 min)
#     the GPU tests (fp8_w8a16_tokens_cuda_test; the one-token forms' plain / latency / RoPE tests
#     the shared device code touched; cuda_engine_fold_test's FP8 cases), fp8_gemv_cuda_bench
#     --only=w8a16-tokens, then decode_step_bench Llama-3-8B at batch 1 / 2 / 4 / 8 with bf16 and
#     FP8, the FP8 steps folded up to 8 tokens (TANDEM_FP8_W16_TOKENS=8) and at batch
#     1 only (=1: 2-8 tokens on the W8A8 path as before), two interleaved rounds; Llama-3-70B FP8
#     at batch 2 / 4 the same way;
#   OUT=DIR tests/gpu/fp8_w16_tokens_call.sh BUNDLE step   (~4 min)
#     decode_step_bench Llama-3-8B FP8 at batch 1 / 2 / 3 / 4 / 8 (bf16 beside in round 1) with the
#     multi-token fold (TANDEM_FP8_W16_TOKENS=auto: the two-CTA rule, the default since the
#     thirty-fifth session) and batch 1 only (=1), two rounds;
#     Llama-3-70B FP8 at batch 2 / 3 the same way;
#   OUT=DIR tests/gpu/fp8_w16_tokens_call.sh BUNDLE trace   (~4 min)
#     as serve, concurrency 2 and 3 only, $TRACE_TOKENS (default "auto 1") twice over, every
#     worker with --step_trace and
#     tandem_bench with --requests_out (read with tests/bench/step_trace_summary.py);
#   OUT=DIR tests/gpu/fp8_w16_tokens_call.sh BUNDLE serve   (~6 min)
#     Llama-3-8B FP8 (dummy weights) served through tandem_router by one mixed CUDA worker, the
#     multi-token fold (auto), batch 1 only, auto again: tandem_bench 1024 in / 256 out at concurrency
#     2 and 3 (32 requests each), Poisson 4 requests/s (48) and concurrency 64 (128).
#
# BUNDLE: a .tar.xz of gb/, or a gb/ directory staged by earlier calls (a bundle too large to
# carry at once: each call carries a part and untars it into the same ignored directory while the
# machine stays warm).
#
# BUNDLE.tar.xz: a tar of directory gb/ made by tests/gpu/bundle.sh gb (check: the tests above,
# tool//kernels/fp8:fp8_gemv_cuda_bench tool//runtime/cuda:decode_step_bench; serve:
# tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
# tool//tests/bench:tandem_bench), binaries stripped, xz-compressed. Logs in $OUT/logs.tgz.
set -u
cd "$(dirname "$0")/../.."
if [[ -d ${1:?bundle .tar.xz or an extracted gb/ directory} ]]; then
  B=$(cd "$1" && pwd)  # staged by earlier calls (a bundle too large to carry at once)
else
  mkdir -p /tmp/b && tar -xJf "$1" -C /tmp/b
  B=/tmp/b/gb
fi
BIN=$B/bin
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64
L=$OUT/logs
mkdir -p "$L"
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader

if [[ ${2:?check, step or serve} == step ]]; then
  DSB=$BIN/runtime/cuda/decode_step_bench
  for r in 1 2; do
    for t in auto 1; do  # auto: the two-CTA rule; 1: batch 1 only (the default)
      TANDEM_FP8_W16_TOKENS=$t timeout 150 "$DSB" --shape=8b --batches=1,2,3,4,8 --context=1024 \
        --steps=48 --quantization=$([[ $r == 1 ]] && echo none,fp8 || echo fp8) \
        > "$L/step8b_t${t}_r$r.log" 2>&1
      echo "8b tokens=$t round $r rc=$?"
      grep -E "^ *[0-9]+ +1024" "$L/step8b_t${t}_r$r.log" | awk '{print $1, $3, $6, $NF}'
    done
  done
  for t in auto 1; do
    TANDEM_FP8_W16_TOKENS=$t timeout 150 "$DSB" --shape=70b --batches=2,3 --context=1024 \
      --steps=24 --quantization=fp8 > "$L/step70b_t$t.log" 2>&1
    echo "70b tokens=$t rc=$?"
    grep -E "^ *[0-9]+ +1024" "$L/step70b_t$t.log" | awk '{print $1, $3, $6, $NF}'
  done
elif [[ $2 == check ]]; then
  for t in kernels/fp8/fp8_w8a16_tokens_cuda_test kernels/fp8/fp8_w8a16_gemv_plain_cuda_test \
    kernels/fp8/fp8_w8a16_gemv_latency_cuda_test kernels/fp8/fp8_w8a16_rope_cuda_test; do
    timeout 240 "$BIN/$t" > "$L/$(basename $t).log" 2>&1
    echo "$(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/$(basename $t).log" | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|actual" "$L/$(basename $t).log" | head -8
  done
  timeout 240 "$BIN/runtime/cuda/cuda_engine_fold_test" --gtest_filter='*Fp8*' \
    > "$L/cuda_engine_fold_test.log" 2>&1
  echo "cuda_engine_fold_test(Fp8) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/cuda_engine_fold_test.log" | tr '\n' ' ')"
  grep -E "Failure|Expected|Which is|seed" "$L/cuda_engine_fold_test.log" | head -8
  timeout 150 "$BIN/kernels/fp8/fp8_gemv_cuda_bench" --only=w8a16-tokens > "$L/tokens_bench.log" 2>&1
  echo "tokens bench rc=$?"
  cat "$L/tokens_bench.log" | head -130
  DSB=$BIN/runtime/cuda/decode_step_bench
  for r in 1 2; do
    for t in 8 1; do
      TANDEM_FP8_W16_TOKENS=$t timeout 150 "$DSB" --shape=8b --batches=1,2,4,8 --context=1024 \
        --steps=48 --quantization=none,fp8 > "$L/dsb8b_t${t}_r$r.log" 2>&1
      echo "8b tokens<=$t round $r rc=$?"
      grep -E "shapes|^ *[0-9]+ " "$L/dsb8b_t${t}_r$r.log" | head -14
    done
  done
  for t in 8 1; do
    TANDEM_FP8_W16_TOKENS=$t timeout 150 "$DSB" --shape=70b --batches=2,4 --context=1024 \
      --steps=24 --quantization=fp8 > "$L/dsb70b_t$t.log" 2>&1
    echo "70b tokens<=$t rc=$?"
    grep -E "shapes|^ *[0-9]+ " "$L/dsb70b_t$t.log" | head -8
  done
  TANDEM_FP8_W16_TOKENS=8 timeout 100 "$DSB" --shape=8b --batches=8 --context=1024 --steps=48 \
    --quantization=fp8 --trace=1 > "$L/dsb8b_trace.log" 2>&1
  echo "trace rc=$?"
  tail -n 24 "$L/dsb8b_trace.log"
else
  for t in kernels/fp8/fp8_w8a16_tokens_cuda_test kernels/fp8/fp8_w8a16_gemv_latency_cuda_test \
    runtime/cuda/cuda_engine_fold_test; do
    [[ -x $BIN/$t ]] || continue  # when the bundle carries them
    timeout 240 "$BIN/$t" > "$L/$(basename $t).log" 2>&1
    echo "$(basename $t) rc=$? $(grep -E '^\[  (PASSED|FAILED) ' "$L/$(basename $t).log" | tr '\n' ' ')"
    grep -E "Failure|Expected|Which is|seed" "$L/$(basename $t).log" | head -8
  done
  source tests/gpu/serve_lib.sh
  serve() {  # TAG TOKENS [c2/c3 only]
    local tag=$1 dir=$L/$1 router
    if serve_start "$dir" 0 "$tag" TANDEM_DUMMY=1 TANDEM_FP8_W16_TOKENS="$2" -- \
      --worker_id="w-$tag" --load_format=dummy --dummy_config=llama3-8b --quantization=fp8 \
      --kv_cache_bytes=20000000000 --max_model_len=4096 --step_trace="$dir/steps.jsonl"; then
      router=$SERVE_ROUTER
      for c in 2 3; do
        timeout 70 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf \
          --max_concurrency=$c --num_requests=32 --prompt_len=1024 --output_len=256 --warmup=1 \
          --seed=40$c --json --requests_out="$dir/c$c.requests.jsonl" > "$dir/c$c.json" \
          2> "$dir/c$c.err"
        echo "$tag c$c rc=$?"
      done
      if [[ -n ${3:-} ]]; then serve_stop; return; fi
      timeout 60 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=4 --num_requests=48 \
        --prompt_len=1024 --output_len=256 --warmup=1 --seed=402 --json \
        > "$dir/r4.json" 2> "$dir/r4.err"
      echo "$tag rate4 rc=$?"
      timeout 60 "$BIN/tests/bench/tandem_bench" --router="$router" --rate=inf \
        --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 \
        --seed=403 --json > "$dir/c64.json" 2> "$dir/c64.err"
      echo "$tag c64 rc=$?"
    fi
    serve_stop
  }
  if [[ $2 == trace ]]; then  # c2 / c3 only, each worker writing its step trace
    # TRACE_TOKENS: the TANDEM_FP8_W16_TOKENS values in turn ("default": empty, the built-in
    # default), each run once, then the list again.
    for round in a b; do
      for t in ${TRACE_TOKENS:-auto 1}; do
        serve "fp8_${t}_$round" "$([[ $t == default ]] || echo "$t")" c23
      done
    done
    bench_summary "$L"/*/c2.json "$L"/*/c3.json
  else
    serve fp8_auto auto
    serve fp8_tokens1 1
    serve fp8_auto_b auto
    bench_summary "$L"/*/c2.json "$L"/*/c3.json "$L"/*/r4.json "$L"/*/c64.json
  fi
  grep -h -i "error\|fail" "$L"/*/worker.log | head -5
fi
cd "$OUT" && tar -czf logs.tgz logs && rm -rf logs
