#!/usr/bin/env bash
# Issue 33's FP8 latent KV on CUDA (the block-interleaved pool, Fp8LatentBlocks) over P -> D and
# with TP / DCP, in one device call on nvidia-h200-x4 (4 GPUs), from the repository root:
#   tests/gpu/mla_fp8_call.sh BUNDLE_TAR_XZ
# Extracts BUNDLE_TAR_XZ (tests/gpu/bundle.sh .. //kernels/mla:mla_plain_fp8_cuda_test
# //kernels/mla:mla_tensor_core_cuda_test tool//runtime:generate
# tool//runtime/model:make_dummy_model tool//runtime:tandem_worker tool//router:tandem_router
# tool//router:tandem_cli), then runs every check in parallel, each under its own timeout:
#   kernels  GPU 3      mla_plain_fp8_cuda_test, mla_tensor_core_cuda_test --gtest_filter=
#                       '*Fp8*:*Dcp*' (FP8 pools both forms; DCP)
#   base     GPU 0      mla_fp8_cuda_golden.sh PARTS=base (CUDA FP8 vs CPU FP8 / transformers)
#   tp       GPUs 1,2   mla_fp8_cuda_golden.sh PARTS=tp SHARE="" (TP=2, TP=2 x DCP=2 vs TP=1 FP8)
#   pd_ucx   GPU 3      mla_serve_pd.sh KV_CACHE_DTYPE=fp8 PD_STAGES=ucx
#   pd_nccl  GPUs 2,3   mla_serve_pd.sh KV_CACHE_DTYPE=fp8 PD_STAGES=nccl
#   pd_nccl21 GPUs 0,1,3  mla_serve_pd.sh KV_CACHE_DTYPE=fp8 PD_STAGES=nccl21 (P TP=2 -> D)
# Logs under $OUT (logs.tar.gz + summary.txt); prints a PASS/FAIL summary.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_fp8_out}
mkdir -p "$OUT"
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/mla_fp8_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
echo "extracted in $((SECONDS - T0)) s"
nvidia-smi -L > "$LOG/gpus.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
cat "$LOG/gpus.txt"

job() {  # NAME SECONDS GPUS CMD...: in the background, its output to $LOG/NAME.txt
  local name=$1 secs=$2 gpus=$3
  shift 3
  (
    t=$SECONDS
    CUDA_VISIBLE_DEVICES=$gpus timeout "$secs" "$@" > "$LOG/$name.txt" 2>&1
    echo "$? $((SECONDS - t))" > "$LOG/$name.rc"
  ) &
}
# The FP8 pool tests are in mla_plain_fp8_cuda_test, the DCP one in mla_tensor_core_cuda_test.
job kernels 40 3 env LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64" bash -c \
  'rc=0; for t; do "$t" --gtest_filter="*Fp8*:*Dcp*" || rc=1; done; exit $rc' _ \
  "$BD/bin/kernels/mla/mla_plain_fp8_cuda_test" "$BD/bin/kernels/mla/mla_tensor_core_cuda_test"
job base 66 0 env PARTS=base tests/gpu/mla_fp8_cuda_golden.sh "$BD" "$LOG/base"
job tp 66 1,2 env PARTS=tp SHARE="" tests/gpu/mla_fp8_cuda_golden.sh "$BD" "$LOG/tp"
job pd_ucx 66 3 env KV_CACHE_DTYPE=fp8 PD_STAGES=ucx tests/gpu/mla_serve_pd.sh "$BD" "$LOG/pd_ucx"
job pd_nccl 66 2,3 env KV_CACHE_DTYPE=fp8 PD_STAGES=nccl \
  tests/gpu/mla_serve_pd.sh "$BD" "$LOG/pd_nccl"
job pd_nccl21 66 0,1,3 env KV_CACHE_DTYPE=fp8 PD_STAGES=nccl21 \
  tests/gpu/mla_serve_pd.sh "$BD" "$LOG/pd_nccl21"
wait

{
  echo "== device: $(head -n 1 "$LOG/gpus.txt") ($(grep -c '^GPU' "$LOG/gpus.txt") GPUs)"
  fails=0
  for n in kernels base tp pd_ucx pd_nccl pd_nccl21; do
    read -r rc secs < "$LOG/$n.rc" || { rc='?'; secs='?'; }
    verdict=PASS
    [[ $rc == 0 ]] || { verdict=FAIL; fails=$((fails + 1)); }
    # A script that skipped for lack of a GPU exits 0 but ran nothing: not a pass.
    if grep -q "no GPU: skipped\|\[  SKIPPED \]" "$LOG/$n.txt"; then verdict=SKIP; fi
    echo "== $n: $verdict (rc $rc in $secs s)"
    grep -E "^(PASS|FAIL|SKIP)|passed|cosine|kv_bytes_received|\[  (PASSED|FAILED) |timed out" \
      "$LOG/$n.txt" | head -n 30
  done
  echo "== total wall $((SECONDS - T0)) s; $fails of 6 jobs failed"
} | tee "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
