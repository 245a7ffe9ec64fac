#!/usr/bin/env bash
# Issue 35's device call (nvidia-h200-x4): the FlashInfer ratio table of every decode and prefill
# shape of the issue, ncu of the shapes below target (ours and FlashInfer's kernels), the
# Llama-3-8B decode step's kernel breakdown, the engine's in-kernel split merge A/B
# (CudaBackendConfig::decode_merge_in_kernel) and the attention / engine tests. One chain of jobs
# per GPU, each job under its own timeout, none started or running past CALL_SECONDS (default
# 120) after the start:
#   GPU 0  attention_vs_flashinfer.sh, batch 1 / 16 decode shapes (bf16; fp8 / int8 rows ours
#          only) and the prefill shapes; then ncu of FlashInfer's kernels (tc-fa2 decode 64x16384,
#          fa3 prefill 8 x 2k)
#   GPU 1  attention_vs_flashinfer.sh, batch 64 / 256 decode shapes; paged_attention_cuda_test
#          (second half)
#   GPU 2  paged_attention_cuda_test (first half), paged_attention_plan_cuda_test; ncu of our
#          decode kernel (bf16 16x4096, 16x16384, 64x16384; fp8 16x16384) and prefill (8 x 2k);
#          decode_step_bench context 16384, batches 1 / 16, merge in kernel on / off
#   GPU 3  cuda_engine_test; decode_step_bench --trace=1 (batch 1, context 1024); context 1024,
#          batches 1 / 64, merge in kernel on / off / on / off
#
#   tests/gpu/attention_step_call.sh BUNDLE_TAR_XZ FLASHINFER_DIR OUT
#
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh of //kernels/attention/cuda:{attention_cuda_bench,
# prefill_attention_cuda_bench, paged_attention_cuda_test, paged_attention_plan_cuda_test} and
# //runtime/cuda:{cuda_engine_test, decode_step_bench}, tar'd and xz'd. FLASHINFER_DIR: the peer
# package (../shared/peers/flashinfer, copied into a git-ignored folder and carried; its archive
# may be re-packed smaller as flashinfer-*.tar.xz). Each FlashInfer instance runs from its own
# copy of the peer folder whose run_flashinfer.sh unpacks into that copy (the original always
# unpacks into /tmp/fi_peers). Run from the repository root (cuda_engine_test reads
# tests/golden/fixtures). Writes OUT/summary.txt, OUT/ratio.txt and OUT/logs.tar.gz.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/gpu/attention_call_lib.sh
source "$HERE/attention_call_lib.sh"
attention_call_start attention_step_call 120 "$@"
R=$W/b/bin/runtime/cuda

cmp() {  # NAME GPU SECONDS, with DECODE_ARGS / FI_DECODE_SHAPES / SKIP_PREFILL set
  peer_copy "$W/$1"
  mkdir -p "$W/$1/tmp"
  TMPDIR=$W/$1/tmp FI_SKIP=tc-fa3,fa2 job "$1" "$2" "$3" \
    "$HERE/attention_vs_flashinfer.sh" "$W/b" "$W/$1" "$OUT/$1"
}

# FlashInfer's kernels under ncu, from cmp_small's unpacked copy: KIND decode (tc-fa2, 64x16384)
# or prefill (fa3, 8 x 2k), a few calls instead of the peer's ~300 ms.
fi_ncu_small() {  # KIND KERNEL_REGEX DRIVER_ARGS...
  local kind=$1 regex=$2
  shift 2
  fi_ncu "fi_ncu_$kind" 0 30 "$W/cmp_small/root" \
    "-k regex:$regex --launch-skip 2 --launch-count 1" "$@"
}

ours_ncu() {  # NAME KERNEL_REGEX SKIP BINARY ARGS...
  local name=$1 regex=$2 skip=$3
  shift 3
  ncu_job "ncu_$name" 2 20 -k "regex:$regex" --launch-skip "$skip" --launch-count 1 "$@"
}

step_bench() {  # NAME GPU SECONDS ARGS...
  local name=$1 gpu=$2 secs=$3
  shift 3
  job "dsb_$name" "$gpu" "$secs" "$R/decode_step_bench" --steps=64 "$@"
}

SMALL=bf16:1x1024,bf16:1x4096,bf16:1x16384,bf16:1x65536,bf16:16x1024,bf16:16x4096
SMALL+=,bf16:16x16384,bf16:16x65536,fp8_e4m3:1x65536,fp8_e4m3:16x4096,fp8_e4m3:16x16384
SMALL+=,int8:1x65536,int8:16x4096,int8:16x16384
LARGE=bf16:64x1024,bf16:64x4096,bf16:64x16384,bf16:64x65536,bf16:256x1024,bf16:256x4096
LARGE+=,bf16:256x16384,bf16:256x65536,fp8_e4m3:64x4096,fp8_e4m3:64x16384,fp8_e4m3:256x4096
LARGE+=,int8:64x4096,int8:64x16384,int8:256x4096
HALF='PagedAttentionCudaTest.DecodeShapesBf16:PagedAttentionCudaTest.LongContexts'
HALF+=':PagedAttentionCudaTest.Fp16:PagedAttentionCudaTest.Fp8PerHeadScale'
(
  DECODE_ARGS="--pool_gib=34 --only=$SMALL" \
    FI_DECODE_SHAPES=1x1024,1x4096,1x16384,1x65536,16x1024,16x4096,16x16384,16x65536 \
    cmp cmp_small 0 75
  if [[ -n $NCU ]]; then
    fi_ncu_small decode BatchPrefillWithPagedKVCache --decode 64x16384 --variants tc-fa2
    fi_ncu_small prefill Prefill --prefill 8x2048 --backends fa3
  fi
) &
(
  DECODE_ARGS="--pool_gib=66 --only=$LARGE" SKIP_PREFILL=1 \
    FI_DECODE_SHAPES=64x1024,64x4096,64x16384,64x65536,256x1024,256x4096,256x16384,256x65536 \
    cmp cmp_large 1 80
  job test_b 1 40 "$A/paged_attention_cuda_test" --gtest_filter="-$HALF"
) &
(
  job test_a 2 35 "$A/paged_attention_cuda_test" --gtest_filter="$HALF"
  job test_plan 2 10 "$A/paged_attention_plan_cuda_test"
  if [[ -n $NCU ]]; then
    ours_ncu bf16_16x4096 PagedDecode 3 "$A/attention_cuda_bench" --pool_gib=2 --only=bf16:16x4096
    ours_ncu bf16_16x16384 PagedDecode 3 "$A/attention_cuda_bench" --pool_gib=2 \
      --only=bf16:16x16384
    ours_ncu bf16_64x16384 PagedDecode 3 "$A/attention_cuda_bench" --pool_gib=5 \
      --only=bf16:64x16384
    ours_ncu fp8_16x16384 PagedDecode 3 "$A/attention_cuda_bench" --pool_gib=2 \
      --only=fp8_e4m3:16x16384
    ours_ncu prefill_8x2k PrefillWgmma 3 "$A/prefill_attention_cuda_bench" --only="8 x 2k"
  else
    echo "ncu not found" >> "$OUT/summary.txt"
  fi
  step_bench ctx16k_on 2 30 --batches=1,16 --context=16384 --merge_in_kernel=1
  step_bench ctx16k_off 2 30 --batches=1,16 --context=16384 --merge_in_kernel=0
) &
(
  TANDEM_FIXTURES=$ROOT/tests/golden/fixtures TANDEM_REQUIRE_GPU=1 \
    job engine 3 75 "$R/cuda_engine_test"
  step_bench trace 3 25 --batches=1 --context=1024 --trace=1
  for round in 1 2; do
    step_bench "ctx1k_on_$round" 3 20 --batches=1,64 --context=1024 --merge_in_kernel=1
    step_bench "ctx1k_off_$round" 3 20 --batches=1,64 --context=1024 --merge_in_kernel=0
  done
) &
wait
cat "$OUT"/cmp_small/ratio.txt "$OUT"/cmp_large/ratio.txt > "$OUT/ratio.txt" 2> /dev/null
(cd "$OUT" && tar czf logs.tar.gz logs cmp_small cmp_large fi_ncu_*.txt* 2> /dev/null)
(cd "$OUT" && rm -rf logs cmp_small cmp_large fi_ncu_*.txt*)
cat "$OUT/summary.txt"
