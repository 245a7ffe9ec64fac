#!/usr/bin/env bash
# FP8 K / V pools of GQA models served (one device call, one GPU; runtime/cuda/README.md):
#   1. P -> D over UCX with FP8 K / V: tests/gpu/mla_serve_pd.sh with MODEL = a head_dim-64 GQA
#      fixture built here by transformers (tests/golden/make_golden_moe.py --only mistral_f32_hd64),
#      KV_CACHE_DTYPE=fp8, PD_STAGES=ucx: a mixed FP8-KV worker's greedy tokens, then a prefill and a
#      decode worker (both FP8 KV) through the router: the same tokens, KV received, no recompute;
#   2. DUMMY_CONFIG (a --dummy_config preset, default llama3-8b; dummy weights, FP8 weights
#      quantized at load) behind its
#      own router, a bf16 KV pool then an FP8 one, the same KV budget (KV_BYTES, default 16e9):
#      tandem_bench for each RUNS entry CONCURRENCY:REQUESTS:PROMPT:OUTPUT[:RATE] (RATE: Poisson
#      requests/s, default inf; default RUNS "1:8:1024:256 128:256:1024:512"). KVS lists the
#      workers, each KV_DTYPE[:PREFILL_KERNEL] (default "auto fp8"; e.g. fp8:mma = the FP8 pool
#      with the mma.sync prefill kernel reading the codes, the widening off).
#   PD=0 skips part 1. Prints the PASS / FAIL lines and one summary line a run; logs in
#   $OUT/logs.tgz.
#
#   OUT=DIR tests/gpu/fp8_kv_serve_call.sh BUNDLE.tar.xz | BUNDLE_DIR
#
# BUNDLE.tar.xz: a tar of directory b2/ made by tests/gpu/bundle.sh b2 //some:gpu_test
# tool//runtime:tandem_worker tool//router:tandem_router tool//router:tandem_cli
# tool//tests/bench:tandem_bench, xz-compressed (or that directory, already unpacked).
set -u
cd "$(dirname "$0")/../.."
D=${1:?bundle .tar.xz or directory}
if [[ ! -d $D ]]; then
  mkdir -p /tmp/b && tar -xJf "$D" -C /tmp/b && D=/tmp/b/b2
fi
D=$(cd "$D" && pwd)
BIN=$D/bin
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$D/lib:/usr/local/cuda/lib64
L=$OUT/logs
mkdir -p "$L"
if [[ ${PD:-1} != 0 ]]; then
  timeout 300 python3 tests/golden/make_golden_moe.py --out "$L/fix" --only mistral_f32_hd64 \
    > "$L/fixture.txt" 2>&1
  tail -n 1 "$L/fixture.txt"
  MODEL=$L/fix/mistral_f32_hd64 KV_CACHE_DTYPE=fp8 PD_STAGES=ucx timeout 300 \
    tests/gpu/mla_serve_pd.sh "$D" "$L/pd" 2>&1 | tail -n 12
fi
source tests/gpu/serve_lib.sh
SERVE_UP_S=240
for variant in ${KVS:-auto fp8}; do
  IFS=: read -r kv pk <<<"$variant"
  name=$kv${pk:+_$pk}
  d=$L/serve_$name
  if serve_start "$d" 0 "${DUMMY_CONFIG:-llama3-8b}-fp8w-kv-$name" -- --worker_id="w-$name" \
    --load_format=dummy --dummy_config="${DUMMY_CONFIG:-llama3-8b}" --quantization=fp8 \
    --kv_cache_dtype=$kv --prefill_kernel="${pk:-auto}" --kv_cache_bytes="${KV_BYTES:-16000000000}" \
    --max_model_len=4096; then
    for run in ${RUNS:-1:8:1024:256 128:256:1024:512}; do
      IFS=: read -r conc reqs plen olen rate <<<"$run"
      timeout "${RUN_S:-150}" "$BIN/tests/bench/tandem_bench" --router="$SERVE_ROUTER" \
        --rate="${rate:-inf}" \
        --max_concurrency="$conc" --num_requests="$reqs" --prompt_len="$plen" --output_len="$olen" \
        --warmup=1 --seed=$((400 + conc)) --json > "$d/c$conc.json" 2> "$d/c$conc.err"
      echo "$name c$conc rc=$?"
    done
  fi
  grep -m 3 -iE "kv pool|blocks|error" "$d/worker.log"
  serve_stop
done
for run in ${RUNS:-1:8:1024:256 128:256:1024:512}; do bench_summary "$L"/serve_*/c"${run%%:*}".json; done
rm -rf "$L/fix"/*/model.safetensors
cd "$OUT" && tar -czf logs.tgz logs && rm -rf logs
