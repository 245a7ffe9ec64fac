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
serve() {  # DIR GPU TAG ENV QUANT
  local dir=$1 gpu=$2 tag=$3 envv=$4 quant=$5 pids=()
  mkdir -p $dir
  $BIN/router/tandem_router --insecure --listen=127.0.0.1:0 --port_file=$dir/router.port > $dir/router.log 2>&1 &
  pids+=($!)
  for i in $(seq 1 300); do [[ -s $dir/router.port ]] && break; sleep 0.1; done
  local router=$(cat $dir/router.port)
  env $envv CUDA_VISIBLE_DEVICES=$gpu $BIN/runtime/tandem_worker --insecure --role=mixed --worker_id=w-$tag \
    --backend=cuda --load_format=dummy --dummy_config=llama3-8b $quant --router=$router --device=0 \
    --kv_cache_bytes=20000000000 --max_model_len=4096 --listen=127.0.0.1:0 --port_file=$dir/worker.port > $dir/worker.log 2>&1 &
  pids+=($!)
  local up=0
  for i in $(seq 1 300); do
    $BIN/router/tandem_cli --insecure workers --router=$router --json 2>/dev/null | grep -q '"healthy":true' && { up=1; break; }
    sleep 0.2
  done
  echo "$tag healthy=$up"
  if [[ $up == 1 ]]; then
    timeout 40 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=1 --num_requests=8 --prompt_len=1024 --output_len=256 --warmup=1 --seed=301 --json > $dir/c1.json 2> $dir/c1.err; echo "$tag c1 rc=$?"
    if [[ $quant == *fp8* ]]; then
      timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=2 --num_requests=32 --prompt_len=1024 --output_len=256 --warmup=1 --seed=302 --json > $dir/r2.json 2> $dir/r2.err; echo "$tag rate2 rc=$?"
      timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 --seed=303 --json > $dir/c64.json 2> $dir/c64.err; echo "$tag c64 rc=$?"
    fi
  fi
  kill ${pids[@]} 2>/dev/null; wait ${pids[@]} 2>/dev/null
}
serve $OUT/auto 0 auto TANDEM_FP8_W16_MMA=auto --quantization=fp8 > $OUT/auto.txt 2>&1 &
serve $OUT/waves 1 waves TANDEM_DUMMY=1 --quantization=fp8 > $OUT/waves.txt 2>&1 &
wait
serve $OUT/bf16 1 bf16 TANDEM_DUMMY=1 --quantization= > $OUT/bf16.txt 2>&1
cat $OUT/auto.txt $OUT/waves.txt $OUT/bf16.txt
for f in $OUT/*/c1.json $OUT/*/r2.json $OUT/*/c64.json; do
  [[ -s $f ]] || { echo "$f missing"; continue; }
  python3 - $f <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    t, p, i = r["ttft_ms"], r["tpot_ms"], r["itl_ms"]
    print("%s: %d ok, TTFT mean %.1f p99 %.1f ms, TPOT mean %.3f ms, ITL p50 %.3f p99 %.3f ms, output tok/s %.1f" % (sys.argv[1].split('/out/')[-1], r["successful_requests"], t["mean"], t["p99"], p["mean"], i["p50"], i["p99"], r["output_token_throughput"]))
PY
done
grep -h -i "error\|fail" $OUT/*/worker.log | head -5
cd $OUT && tar -czf logs.tgz auto waves bf16 && rm -rf auto waves bf16
