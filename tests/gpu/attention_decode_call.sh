#!/usr/bin/env bash
# Issue 35's paged-decode device call (nvidia-h200-x4), everything in parallel on the 4 GPUs, each
# job under its own timeout (the whole call within ~100 s):
#   GPU 0, 3  paged_attention_cuda_test (two halves), then dcp_cuda_test on GPU 3
#   GPU 1     attention_vs_flashinfer.sh: NEW (in-kernel split merge) vs OLD (a build of the
#             previous commit) vs FlashInfer 0.7.2 on the issue's decode shapes (bf16; fp8 / int8
#             rows for ours), then NEW with --separate_merge and forced-split sweeps, same GPU
#   GPU 2     ncu of the decode kernel (1x4096 old and new, 16x4096, 16x16384, fp8 16x16384)
#
#   tests/gpu/attention_decode_call.sh BUNDLES_TAR_XZ FLASHINFER_DIR OUT
#
# BUNDLES_TAR_XZ: a tar.xz of new/ (tests/gpu/bundle.sh of paged_attention_cuda_test,
# dcp_cuda_test, attention_cuda_bench) and old/bin/kernels/attention/cuda/attention_cuda_bench
# (the previous commit's bench; it uses new/lib). Writes OUT/summary.txt (a line per job),
# OUT/ratio.txt and OUT/logs.tar.gz.
set -uo pipefail
[[ $# -eq 3 ]] || { echo "usage: $0 BUNDLES_TAR_XZ FLASHINFER_DIR OUT" >&2; exit 2; }
TARBALL=$(realpath "$1")
FI=$(realpath "$2")
mkdir -p "$3/logs" && OUT=$(realpath "$3")
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
W=${TMPDIR:-/tmp}/attention_decode_call
rm -rf "$W" && mkdir -p "$W"
xz -dc "$TARBALL" | tar xf - -C "$W" || { echo "cannot unpack $TARBALL" >&2; exit 1; }
ln -sfn "$W/new/lib" "$W/old/lib"
export NCCL_NVLS_ENABLE=0
export LD_LIBRARY_PATH="$W/new/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:/usr/local/cuda/lib64"
BIN=bin/kernels/attention/cuda
L=$OUT/logs
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$L/gpu.txt" 2>&1

job() {  # NAME GPU SECONDS COMMAND...: runs COMMAND on GPU under a timeout, logs to L/NAME.log
  local name=$1 gpu=$2 secs=$3
  shift 3
  local t0=$SECONDS
  CUDA_VISIBLE_DEVICES=$gpu timeout "$secs" "$@" > "$L/$name.log" 2>&1
  local rc=$?
  echo "$name gpu=$gpu rc=$rc $((SECONDS - t0))s" >> "$OUT/summary.txt"
}

A='PagedAttentionCudaTest.DecodeShapesBf16:PagedAttentionCudaTest.LongContexts'
A+=':PagedAttentionCudaTest.Fp16:PagedAttentionCudaTest.Fp8PerHeadScale'
( job test_a 0 90 "$W/new/$BIN/paged_attention_cuda_test" --gtest_filter="$A" ) &
( job test_b 3 90 "$W/new/$BIN/paged_attention_cuda_test" --gtest_filter="-$A"
  job dcp 3 60 "$W/new/$BIN/dcp_cuda_test" ) &

SHAPES=bf16:1x1024,bf16:1x4096,bf16:1x16384,bf16:1x65536,bf16:16x1024,bf16:16x4096
SHAPES+=,bf16:16x16384,bf16:16x65536,bf16:64x4096,bf16:64x16384
SHAPES+=,fp8_e4m3:1x65536,fp8_e4m3:16x4096,fp8_e4m3:16x16384,fp8_e4m3:64x16384
SHAPES+=,int8:1x65536,int8:16x4096,int8:16x16384,int8:64x16384
SWEEP=bf16:1x1024@8,bf16:1x1024@16,bf16:1x4096@16,bf16:1x4096@32,bf16:1x4096@33
SWEEP+=,bf16:1x16384@16,bf16:1x16384@32,bf16:1x16384@33,bf16:1x65536@32,bf16:1x65536@33
SWEEP+=,bf16:1x65536@64,bf16:1x65536@66,bf16:16x1024@1,bf16:16x1024@2,bf16:16x4096@1
SWEEP+=,bf16:16x4096@2,bf16:16x16384@2,bf16:16x16384@4
(
  export DECODE_ARGS="--pool_gib=12 --only=$SHAPES" SKIP_PREFILL=1 FI_SKIP=tc-fa3
  export FI_DECODE_SHAPES=1x1024,1x4096,1x16384,1x65536,16x1024,16x4096,16x16384
  job cmp 1 100 "$HERE/attention_vs_flashinfer.sh" "$W/new" "$FI" "$OUT/cmp" "$W/old"
  job separate 1 30 "$W/new/$BIN/attention_cuda_bench" --flush_l2 --pool_gib=12 \
    --only="$SHAPES" --separate_merge
  job sweep 1 30 "$W/new/$BIN/attention_cuda_bench" --flush_l2 --pool_gib=12 --only="$SWEEP"
  job sweep_separate 1 30 "$W/new/$BIN/attention_cuda_bench" --flush_l2 --pool_gib=12 \
    --only="$SWEEP" --separate_merge
) &

NCU=$(command -v ncu || find /usr/local -maxdepth 3 -path "*/bin/ncu" 2>/dev/null | head -1)
if [[ -n $NCU ]]; then
  ncu_job() {  # NAME BUNDLE SHAPE
    job "ncu_$1" 2 25 "$NCU" --clock-control none -k regex:PagedDecode --launch-skip 3 \
      --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
      --section Occupancy --section LaunchStats --section SchedulerStats \
      --section WarpStateStats "$2/$BIN/attention_cuda_bench" --pool_gib=4 --only="$3"
  }
  (
    ncu_job new_1x4096 "$W/new" bf16:1x4096
    ncu_job old_1x4096 "$W/old" bf16:1x4096
    ncu_job new_16x4096 "$W/new" bf16:16x4096
    ncu_job new_16x16384 "$W/new" bf16:16x16384
    ncu_job new_fp8_16x16384 "$W/new" fp8_e4m3:16x16384
  ) &
else
  echo "ncu not found" >> "$OUT/summary.txt"
fi
wait
cp "$OUT/cmp/ratio.txt" "$OUT/ratio.txt" 2> /dev/null
(cd "$OUT" && tar czf logs.tar.gz logs cmp && rm -rf logs cmp)
cat "$OUT/summary.txt"
