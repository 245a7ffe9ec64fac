#!/usr/bin/env bash
# Served Qwen3-30B-A3B (dummy weights; DeepSeek-V2-Lite for PAIRS=v2lite) in FP8 forms and bf16 on
# nvidia-h200-x2, one mixed CUDA worker per GPU, each behind its own router (tests/gpu/serve_lib.sh),
# two at a time
# (kernels/moe/BENCHMARKS.md, nineteenth and twentieth sessions). PAIRS (default "scaled"):
#   scaled: online FP8 (--quantization=fp8: per-channel weights, per-token activations) with the
#     CUTLASS prefill's broadcast row form (TANDEM_MOE_FP8_CUTLASS_SCALES=row, GPU 0) vs the
#     default scaled form (GPU 1); then bf16 (GPU 0) vs the default again (GPU 1);
#   prefill: online FP8 with the old per-expert prefill (TANDEM_MOE_FP8_PREFILL=per-expert,
#     GPU 0) vs the default (GPU 1);
#   block: bf16 (GPU 0) vs the block-FP8 form (--dummy_config=qwen3-30b-a3b-fp8, GPU 1);
#   swap: the block-FP8 form without the swapped decode GEMMs (TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS=0,
#     GPU 0) vs the default (GPU 1);
#   v2lite: DeepSeek-V2-Lite-FP8 (--dummy_config=deepseek-v2-lite-fp8) with its dense layer's
#     prefill on the chunked GEMV (TANDEM_FP8_ROW_GEMM=0, GPU 0) vs the default CUTLASS row GEMM
#     (GPU 1); then V2-Lite bf16 (GPU 0) vs the default again (GPU 1);
#   blockstart: the block-FP8 forms (V2-Lite-FP8, then Qwen3-30B-A3B-FP8) as the twenty-first
#     session found them (TANDEM_FP8_ROW_GEMM=0, TANDEM_FP8_QUANT_VEC_GROUPS=0,
#     TANDEM_FP8_GROUP_CODES=0: GPU 0) vs the default (GPU 1).
# tandem_bench per worker: 4,096-token prompts at Poisson 1 req/s (16 requests, 128 out) and at
# concurrency 16 (48, 64 out); 1,024 / 256 at concurrency 64 (128). From the repository root:
#   PAIRS="scaled block" tests/gpu/moe_fp8_serve_call.sh BUNDLE.tar.xz
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
source tests/gpu/serve_lib.sh
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/tmp/sb/lib:$ICU:/usr/local/cuda/lib64
nvidia-smi -L > $OUT/gpus.txt
serve() {  # DIR GPU TAG ENV[,ENV...] DUMMY_CONFIG [WORKER_FLAGS...]
  local dir=$1 gpu=$2 tag=$3 envv=$4 cfg=$5 router
  shift 5
  if serve_start $dir $gpu $tag ${envv//,/ } -- --worker_id=w-$tag --load_format=dummy \
    --dummy_config=$cfg --kv_cache_bytes=30000000000 --max_model_len=8192 "$@"; then
    router=$SERVE_ROUTER
    timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=1 --num_requests=16 --prompt_len=4096 --output_len=128 --warmup=1 --seed=401 --json > $dir/p1.json 2> $dir/p1.err; echo "$tag poisson1 rc=$? at $SECONDS"
    timeout 90 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=16 --num_requests=48 --prompt_len=4096 --output_len=64 --warmup=1 --seed=402 --json > $dir/c16.json 2> $dir/c16.err; echo "$tag c16 rc=$? at $SECONDS"
    timeout 60 $BIN/tests/bench/tandem_bench --router=$router --rate=inf --max_concurrency=64 --num_requests=128 --prompt_len=1024 --output_len=256 --warmup=1 --seed=403 --json > $dir/c64.json 2> $dir/c64.err; echo "$tag c64 rc=$? at $SECONDS"
  fi
  serve_stop
}
pair() {  # TAG0 ENV0 CONFIG0 FLAGS0 TAG1 ENV1 CONFIG1 FLAGS1 (GPU 0, GPU 1, at once)
  serve $OUT/$1 0 $1 $2 $3 $4 > $OUT/$1.txt 2>&1 &
  serve $OUT/$5 1 $5 $6 $7 $8 > $OUT/$5.txt 2>&1 &
  wait
}
dirs=()
for p in ${PAIRS:-scaled}; do
  case $p in
    scaled)
      pair row TANDEM_MOE_FP8_CUTLASS_SCALES=row qwen3-30b-a3b --quantization=fp8 \
        scaled TANDEM_X=1 qwen3-30b-a3b --quantization=fp8
      pair bf16 TANDEM_X=1 qwen3-30b-a3b --quantization= \
        scaled2 TANDEM_X=1 qwen3-30b-a3b --quantization=fp8
      dirs+=(row scaled bf16 scaled2) ;;
    prefill)
      pair old TANDEM_MOE_FP8_PREFILL=per-expert qwen3-30b-a3b --quantization=fp8 \
        new TANDEM_X=1 qwen3-30b-a3b --quantization=fp8
      dirs+=(old new) ;;
    block)
      pair bf16b TANDEM_X=1 qwen3-30b-a3b --quantization= \
        block TANDEM_X=1 qwen3-30b-a3b-fp8 --quantization=
      dirs+=(bf16b block) ;;
    swap)
      pair noswap TANDEM_MOE_FP8_CUTLASS_SWAP_ROWS=0 qwen3-30b-a3b-fp8 --quantization= \
        swap TANDEM_X=1 qwen3-30b-a3b-fp8 --quantization=
      dirs+=(noswap swap) ;;
    v2lite)
      pair chunks TANDEM_FP8_ROW_GEMM=0 deepseek-v2-lite-fp8 --quantization= \
        rowgemm TANDEM_X=1 deepseek-v2-lite-fp8 --quantization=
      pair v2bf16 TANDEM_X=1 deepseek-v2-lite --quantization= \
        rowgemm2 TANDEM_X=1 deepseek-v2-lite-fp8 --quantization=
      dirs+=(chunks rowgemm v2bf16 rowgemm2) ;;
    blockstart)
      old=TANDEM_FP8_ROW_GEMM=0,TANDEM_FP8_QUANT_VEC_GROUPS=0,TANDEM_FP8_GROUP_CODES=0
      pair v2start $old deepseek-v2-lite-fp8 --quantization= \
        v2now TANDEM_X=1 deepseek-v2-lite-fp8 --quantization=
      pair q3start $old qwen3-30b-a3b-fp8 --quantization= \
        q3now TANDEM_X=1 qwen3-30b-a3b-fp8 --quantization=
      dirs+=(v2start v2now q3start q3now) ;;
  esac
done
{
  cat $OUT/gpus.txt
  for d in ${dirs[@]}; do cat $OUT/$d.txt; done
  for d in ${dirs[@]}; do bench_summary $OUT/$d/p1.json $OUT/$d/c16.json $OUT/$d/c64.json; done
  grep -h -i "error\|fail" $OUT/*/worker.log | head -5
  echo "total $((SECONDS - T0)) s"
} > $OUT/summary.txt 2>&1
cat $OUT/summary.txt
cd $OUT && tar -czf logs.tgz ${dirs[@]} && rm -rf ${dirs[@]}
