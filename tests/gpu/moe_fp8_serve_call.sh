#!/usr/bin/env bash
# Served Qwen3-30B-A3B (dummy weights) in three FP8 forms and bf16 on nvidia-h200-x2 (one mixed CUDA
# worker per GPU, each behind its own router; kernels/moe/BENCHMARKS.md, nineteenth session):
#   pair 1, at once: online FP8 (--quantization=fp8: per-channel weights, per-token activations)
#     with the old per-expert prefill (TANDEM_MOE_FP8_PREFILL=per-expert, GPU 0) vs the default
#     (the CUTLASS grouped GEMM with broadcast scales and the fused activation passes, GPU 1);
#   pair 2, at once: bf16 (GPU 0) vs the block-FP8 form (--dummy_config=qwen3-30b-a3b-fp8, GPU 1).
# tandem_bench per worker: 4,096-token prompts at Poisson 1 req/s (16 requests, 128 out) and at
# concurrency 16 (48, 64 out); 1,024 / 256 at concurrency 64 (128). From the repository root:
#   tests/gpu/moe_fp8_serve_call.sh BUNDLE.tar.xz
# BUNDLE: tests/gpu/bundle.sh DIR tool//runtime:tandem_worker tool//router:tandem_router
# tool//router:tandem_cli tool//tests/bench:tandem_bench (plus any // test target), tar'd and xz'd.
# Where the bundle would pass the upload limit, ship the router's ICU libraries (libicuuc,
# libicudata) in an earlier call on the same warm machine into ICU_DIR (default
# .gpu_bundle19/icu_lib, an ignored path that stays between calls) and leave them out of BUNDLE.
# Summary and logs under $OUT.
set -u
T0=$SECONDS
ICU=${ICU_DIR:-$PWD/.gpu_bundle19/icu_lib}
mkdir -p /tmp/sb && tar -xJf "${1:?bundle}" -C /tmp/sb
BIN=/tmp/sb/bin
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/tmp/sb/lib:$ICU:/usr/local/cuda/lib64
nvidia-smi -L > $OUT/gpus.txt
serve() {  # DIR GPU TAG ENV DUMMY_CONFIG EXTRA
  local dir=$1 gpu=$2 tag=$3 envv=$4 cfg=$5 extra=$6 pids=() t0=$SECONDS
  mkdir -p $dir
  $BIN/router/tandem_router --insecure --listen=127.0.0.1:0 --port_file=$dir/router.port > $dir/router.log 2>&1 &
  pids+=($!)
  for i in $(seq 1 300); do [[ -s $dir/router.port ]] && break; sleep 0.1; done
  local router=$(cat $dir/router.port)
  env $envv CUDA_VISIBLE_DEVICES=$gpu $BIN/runtime/tandem_worker --insecure --role=mixed --worker_id=w-$tag \
    --backend=cuda --load_format=dummy --dummy_config=$cfg $extra --router=$router --device=0 \
    --kv_cache_bytes=30000000000 --max_model_len=8192 --listen=127.0.0.1:0 --port_file=$dir/worker.port > $dir/worker.log 2>&1 &
  pids+=($!)
  local up=0
  for i in $(seq 1 600); do
    $BIN/router/tandem_cli --insecure workers --router=$router --json 2>/dev/null | grep -q '"healthy":true' && { up=1; break; }
    sleep 0.2
  done
  echo "$tag healthy=$up after $((SECONDS - t0)) s"
  if [[ $up == 1 ]]; then
    timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=1 --num_requests=16 --prompt_len=4096 --output_len=128 --warmup=1 --seed=401 --json > $dir/p1.json 2> $dir/p1.err; echo "$tag poisson1 rc=$? at $SECONDS"
    timeout 90 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=16 --num_requests=48 --prompt_len=4096 --output_len=64 --warmup=1 --seed=402 --json > $dir/c16.json 2> $dir/c16.err; echo "$tag c16 rc=$? at $SECONDS"
    timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 --seed=403 --json > $dir/c64.json 2> $dir/c64.err; echo "$tag c64 rc=$? at $SECONDS"
  fi
  kill ${pids[@]} 2>/dev/null; wait ${pids[@]} 2>/dev/null
}
serve $OUT/old 0 old TANDEM_MOE_FP8_PREFILL=per-expert qwen3-30b-a3b --quantization=fp8 > $OUT/old.txt 2>&1 &
serve $OUT/new 1 new TANDEM_X=1 qwen3-30b-a3b --quantization=fp8 > $OUT/new.txt 2>&1 &
wait
serve $OUT/bf16 0 bf16 TANDEM_X=1 qwen3-30b-a3b "" > $OUT/bf16.txt 2>&1 &
serve $OUT/block 1 block TANDEM_X=1 qwen3-30b-a3b-fp8 "" > $OUT/block.txt 2>&1 &
wait
{
cat $OUT/gpus.txt $OUT/old.txt $OUT/new.txt $OUT/bf16.txt $OUT/block.txt
for f in $OUT/*/p1.json $OUT/*/c16.json $OUT/*/c64.json; do
  [[ -s $f ]] || { echo "$f missing"; continue; }
  python3 - $f <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("%s: %d ok, TTFT mean %.1f p50 %.1f p99 %.1f ms, TPOT mean %.2f ms, ITL p50 %.2f p99 %.2f ms, output tok/s %.1f" % ("/".join(sys.argv[1].split('/')[-2:]), r["successful_requests"], t["mean"], t.get("p50", -1), t["p99"], p["mean"], i["p50"], i["p99"], r["output_token_throughput"]))
PY
done
grep -h -i "error\|fail" $OUT/*/worker.log | head -5
grep -h "moe\|cutlass\|fp8" $OUT/new/worker.log | head -5
echo "total $((SECONDS - T0)) s"
} > $OUT/summary.txt 2>&1
cat $OUT/summary.txt
cd $OUT && tar -czf logs.tgz old new bf16 block && rm -rf old new bf16 block
