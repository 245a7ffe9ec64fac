#!/usr/bin/env bash
# Issue 35's ratio table, the two pieces attention_step_call.sh left out, for one device call on
# two GPUs of an nvidia-h200-x4 (about 70 s; no job starts or runs past CALL_SECONDS, default 90):
#   GPU A  the prefill shapes against cuDNN: attention_vs_flashinfer.sh on the four prefill shapes
#          and the batch-1 decode shapes below 1.0 (1x4096, 1x65536; ours, then FlashInfer's
#          cuda-core / tc-fa2 and FA3), then cuDNN SDPA on the prefill shapes on the same GPU
#          (peers_attention.py --modes cudnn_prefill: bf16, causal, GQA as enable_gqa or with the
#          KV heads expanded, extend through a bottom-right mask); the ratio table gets a cuDNN
#          column (cuDNN's time / ours; the issue's target >= 0.95)
#   GPU B  ncu of the batch-1 decode shapes below 1.0: our kernel at 1x4096 and 1x65536, then
#          FlashInfer's cuda-core and tc-fa2 kernels with their split merges (fi_ncu_driver.py),
#          the rows by ncu_rows.py: DRAM read bandwidth, grid and waves, issue rate, top stalls
#
#   tests/gpu/attention_peer_extra_call.sh BUNDLE_TAR_XZ FLASHINFER_DIR OUT
#
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh of //kernels/attention/cuda:attention_cuda_bench and
# //kernels/attention/cuda:prefill_attention_cuda_bench, tar'd and xz'd. FLASHINFER_DIR: the peer
# package (../shared/peers/flashinfer, or a copy with its archive re-packed as flashinfer-*.tar.xz)
# in a git-ignored folder of the checkout, carried. Environment: EXTRA_GPUS=A,B (default 0,1; one
# GPU: the chains run one after the other), CUDNN_ARGS (e.g. --dry_run). Writes OUT/summary.txt
# (printed: job status, the ratio table, the ncu rows), OUT/ratio.txt, OUT/ncu_rows.txt and
# OUT/logs.tar.gz.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/gpu/attention_call_lib.sh
source "$HERE/attention_call_lib.sh"
attention_call_start attention_peer_extra_call 90 "$@"
IFS=, read -r GA GB <<< "${EXTRA_GPUS:-0,1}"
GB=${GB:-$GA}

ratio_chain() {  # GPU A: ours, FlashInfer and cuDNN on one GPU, then the table
  peer_copy "$W/cmp"
  mkdir -p "$W/cmp/tmp"
  DECODE_ARGS="--pool_gib=2 --only=bf16:1x4096,bf16:1x65536" FI_DECODE_SHAPES=1x4096,1x65536 \
    TMPDIR=$W/cmp/tmp FI_SKIP=tc-fa3,fa2 job cmp "$GA" 60 \
    "$HERE/attention_vs_flashinfer.sh" "$W/b" "$W/cmp" "$OUT/cmp"
  # shellcheck disable=SC2086  # CUDNN_ARGS is a word list
  job cudnn "$GA" 30 python3 "$HERE/peers_attention.py" --modes cudnn_prefill \
    --json "$OUT/cmp/cudnn_prefill.json" ${CUDNN_ARGS:-}
  python3 "$HERE/attention_vs_flashinfer.py" "$OUT/cmp" > "$OUT/ratio.txt" 2>&1
}

ncu_chain() {  # GPU B: our decode kernel, then FlashInfer's, at 1x4096 and 1x65536
  fi_unpack "$W/fi" &  # on the CPU while our kernels are profiled
  local unpack=$! shape
  if [[ -z $NCU ]]; then
    echo "ncu not found" >> "$OUT/summary.txt"
    wait "$unpack"
    return
  fi
  for shape in 1x4096 1x65536; do
    ncu_job "ncu_ours_$shape" "$GB" 20 -k regex:PagedDecode --launch-skip 3 --launch-count 1 \
      "$A/attention_cuda_bench" --pool_gib=2 --only="bf16:$shape"
  done
  wait "$unpack"
  for shape in 1x4096 1x65536; do  # every launch: the first call and one more of each variant
    fi_ncu "ncu_fi_$shape" "$GB" 30 "$W/fi/root" \
      "-k regex:BatchDecodeWithPagedKVCache|BatchPrefillWithPagedKVCache|MergeStates" \
      --decode "$shape" --variants cuda-core,tc-fa2 --calls 1
  done
}

if [[ $GA == "$GB" ]]; then
  ratio_chain
  ncu_chain
else
  ratio_chain &
  ncu_chain &
  wait
fi
rows=()
for shape in 1x4096 1x65536; do
  rows+=("ours bf16 $shape=$L/ncu_ours_$shape.log" "FlashInfer $shape=$L/ncu_fi_$shape.log")
done
python3 "$HERE/ncu_rows.py" "${rows[@]}" > "$OUT/ncu_rows.txt" 2>&1
{
  echo "== GPUs (A=$GA, B=$GB):"
  cat "$L/gpu.txt"
  echo "== ratio table (GPU $GA)"
  cat "$OUT/ratio.txt"
  echo "== ncu (GPU $GB, --clock-control none)"
  cat "$OUT/ncu_rows.txt"
} >> "$OUT/summary.txt"
(cd "$OUT" && tar czf logs.tar.gz logs cmp ncu_fi_*.txt* 2> /dev/null)
(cd "$OUT" && rm -rf logs cmp ncu_fi_*.txt*)
cat "$OUT/summary.txt"
