#!/usr/bin/env bash
# Issue 38 (one device call, nvidia-h200-x2, ~45 s): Llama-3-8B FP8 (dummy weights, online FP8)
# served through tandem_router by a mixed CUDA worker, the batch-1 W8A16 GEMV on kAuto
# (TANDEM_FP8_W16_MMA=auto, GPU 0) and on the default kAutoWaves (GPU 1) at the same time, each
# behind its own router: tandem_bench 1024 in / 256 out at concurrency 1 (8 requests), Poisson 2
# requests/s (32) and concurrency 64 (128); then a bf16 worker on GPU 1 at concurrency 1 (the
# FP8 / bf16 ratio's base). Prints one summary line per run (TTFT, TPOT, ITL p50 / p99, output
# tok/s); logs in $OUT/logs.tgz.
#
#   OUT=DIR tests/gpu/fp8_w16_serve_call.sh BUNDLE.tar.xz
#
# BUNDLE.tar.xz: a tar of directory b7/ made by tests/gpu/bundle.sh b7 //some:gpu_test
# tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
# tool//tests/bench:tandem_bench (then only those four binaries kept), xz-compressed.
set -u
cd "$(dirname "$0")/../.."
mkdir -p /tmp/b && tar -xJf "${1:?bundle .tar.xz}" -C /tmp/b
BIN=/tmp/b/b7/bin
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/tmp/b/b7/lib:/usr/local/cuda/lib64
source tests/gpu/serve_lib.sh
serve() {  # DIR GPU TAG ENV QUANT
  local dir=$1 gpu=$2 tag=$3 envv=$4 quant=$5 router
  if serve_start $dir $gpu $tag $envv -- --worker_id=w-$tag --load_format=dummy \
    --dummy_config=llama3-8b $quant --kv_cache_bytes=20000000000 --max_model_len=4096; then
    router=$SERVE_ROUTER
    timeout 40 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=1 --num_requests=8 --prompt_len=1024 --output_len=256 --warmup=1 --seed=301 --json > $dir/c1.json 2> $dir/c1.err; echo "$tag c1 rc=$?"
    if [[ $quant == *fp8* ]]; then
      timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=2 --num_requests=32 --prompt_len=1024 --output_len=256 --warmup=1 --seed=302 --json > $dir/r2.json 2> $dir/r2.err; echo "$tag rate2 rc=$?"
      timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 --seed=303 --json > $dir/c64.json 2> $dir/c64.err; echo "$tag c64 rc=$?"
    fi
  fi
  serve_stop
}
serve $OUT/auto 0 auto TANDEM_FP8_W16_MMA=auto --quantization=fp8 > $OUT/auto.txt 2>&1 &
serve $OUT/waves 1 waves TANDEM_DUMMY=1 --quantization=fp8 > $OUT/waves.txt 2>&1 &
wait
serve $OUT/bf16 1 bf16 TANDEM_DUMMY=1 --quantization= > $OUT/bf16.txt 2>&1
cat $OUT/auto.txt $OUT/waves.txt $OUT/bf16.txt
bench_summary $OUT/*/c1.json $OUT/*/r2.json $OUT/*/c64.json
grep -h -i "error\|fail" $OUT/*/worker.log | head -5
cd $OUT && tar -czf logs.tgz auto waves bf16 && rm -rf auto waves bf16
