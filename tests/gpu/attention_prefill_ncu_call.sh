#!/usr/bin/env bash
# Issue 35's remaining measurements in one device call on one GPU (nvidia-h200, about 130 s; no
# job starts or runs past CALL_SECONDS, default 140), jobs one after the other:
#   tests   gemv_rope_cuda_test, gemv_cuda_test; cuda_engine_fold_test's folded-step tests
#           (--gtest_filter=*Fold*)
#   ab_*    decode_step_bench at batch 1, context 1024: the old binary (BUNDLE's bin/old) and the
#           new one with --fold_rope=1 / 0 (RoPE + KV write in the qkv GEMV or its own kernel),
#           interleaved, two rounds
#   dsb_trace   the new binary's step under CUPTI (--trace=1), batches 1 and 64, rope folded,
#           then batch 1 unfolded: time per kernel class, busy and idle GPU time
#   ncu_ours_*  ncu of our wgmma prefill kernel on causal 1x4k, 1x16k and 2k over an 8k prefix
#   ncu_cudnn   ncu of cuDNN's prefill kernels (torch SDPA, cuDNN backend only) on the four prefill
#           shapes (peers_attention.py --modes cudnn_ncu: one profiled call a shape / mask)
#   ncu_fa3     ncu of FlashInfer's FA3 prefill on 1x4k, 1x16k and the extend shape
#               (fi_ncu_driver.py: its first call and one more per shape)
# ncu runs with attention_call_lib.sh's sections plus the tensor pipes' utilisation; if ncu
# rejects that metric, the job reruns without it. Rows by ncu_rows.py --every (every launch,
# TFLOP/s of the shape's causal work over the kernel's ncu duration). PARTS (default
# tests,ab,trace,ncu) picks the groups; GEMV_FILTER / GEMV_SECONDS: gemv_cuda_test's gtest filter
# and timeout (default *, 20).
#
#   tests/gpu/attention_prefill_ncu_call.sh BUNDLE_TAR_XZ FLASHINFER_DIR OUT
#
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh of //kernels/attention/cuda:prefill_attention_cuda_bench,
# //kernels/gemm/cuda:{gemv_rope_cuda_test,gemv_cuda_test}, //runtime/cuda:cuda_engine_test and
# //runtime/cuda:decode_step_bench, plus bin/old/decode_step_bench (the baseline build), tar'd and
# xz'd. FLASHINFER_DIR: the peer package (as attention_step_call.sh takes it; a folder without
# run_flashinfer.sh skips the FA3 job: the carried tree's 64 MiB may not hold it). Writes
# OUT/summary.txt (printed), OUT/ncu_rows.txt and OUT/logs.tar.gz.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# shellcheck source=tests/gpu/attention_call_lib.sh
source "$HERE/attention_call_lib.sh"
attention_call_start attention_prefill_ncu_call 140 "$@"
B=$W/b/bin
PARTS=${PARTS:-tests,ab,trace,ncu}
TENSOR_PIPES='regex:sm__pipe_tensor_op_.*_cycles_active\.avg\.pct_of_peak_sustained_active'

ncu_prefill() {  # NAME SECONDS ARGS... (ncu's filter, then the command): + tensor pipes, fallback
  local name=$1 secs=$2 last=$((${#NCU_SECTIONS[@]} - 1))
  shift 2
  job "$name" 0 "$secs" "$NCU" --clock-control none "${NCU_SECTIONS[@]:0:last-1}" \
    --metrics "${NCU_SECTIONS[last]},$TENSOR_PIPES" "$@"
  if grep -qi '==ERROR==.*metric' "$L/$name.log" && ! grep -q 'Duration' "$L/$name.log"; then
    mv "$L/$name.log" "$L/$name.pipes_rejected.log"
    job "$name" 0 "$secs" "$NCU" --clock-control none "${NCU_SECTIONS[@]}" "$@"
  fi
}

unpack=
if [[ -f $FI/run_flashinfer.sh ]]; then
  fi_unpack "$W/fi" &  # on the CPU while the GPU runs the tests and the decode steps
  unpack=$!
fi
if [[ $PARTS == *tests* ]]; then
  job gemv_rope 0 20 "$B/kernels/gemm/cuda/gemv_rope_cuda_test"
  job gemv 0 "${GEMV_SECONDS:-20}" "$B/kernels/gemm/cuda/gemv_cuda_test" \
    --gtest_filter="${GEMV_FILTER:-*}"
  TANDEM_FIXTURES=$ROOT/tests/golden/fixtures TANDEM_REQUIRE_GPU=1 \
    job engine_fold 0 30 "$B/runtime/cuda/cuda_engine_fold_test" --gtest_filter='*Fold*'
fi
for round in 1 2; do
  [[ $PARTS == *ab* ]] || break
  job "ab_old_$round" 0 15 "$B/old/decode_step_bench" --steps=64 --batches=1 --context=1024
  job "ab_rope1_$round" 0 15 "$B/runtime/cuda/decode_step_bench" --steps=64 --batches=1 \
    --context=1024 --fold_rope=1
  job "ab_rope0_$round" 0 15 "$B/runtime/cuda/decode_step_bench" --steps=64 --batches=1 \
    --context=1024 --fold_rope=0
done
if [[ $PARTS == *trace* ]]; then
  job dsb_trace 0 25 "$B/runtime/cuda/decode_step_bench" --steps=64 --batches=1,64 \
    --context=1024 --fold_rope=1 --trace=1
  job dsb_trace_rope0 0 25 "$B/runtime/cuda/decode_step_bench" --steps=64 --batches=1 \
    --context=1024 --fold_rope=0 --trace=1
fi
if [[ -n $NCU && $PARTS == *ncu* ]]; then
  for shape in "1 x 4k" "1 x 16k" "8k prefix"; do
    ncu_prefill "ncu_ours_${shape// /}" 20 -k regex:PrefillWgmma --launch-skip 3 \
      --launch-count 1 "$B/kernels/attention/cuda/prefill_attention_cuda_bench" --only="$shape"
  done
  ncu_prefill ncu_cudnn 35 --profile-from-start off --target-processes all \
    python3 "$HERE/peers_attention.py" --modes cudnn_ncu
  if [[ -n $unpack ]]; then
    wait "$unpack"
    root=$W/fi/root
    PYTHONPATH=$root/site PYTHONNOUSERSITE=1 FLASHINFER_WORKSPACE_BASE=$root/ws TMPDIR=$root/tmp \
      ncu_prefill ncu_fa3 35 --target-processes all -k regex:Prefill \
      python3 "$HERE/fi_ncu_driver.py" "$FI/peers_flashinfer.py" "$OUT/ncu_fa3.txt" \
      --prefill "1x4096,1x16384,2k new / 8k prefix" --backends fa3 --calls 1
  else
    echo "ncu_fa3 not run: no FlashInfer package in $FI" >> "$OUT/summary.txt"
  fi
else
  echo "ncu not found" >> "$OUT/summary.txt"
fi
wait
# Causal work (4 * 128 * 32 * visible keys) of each shape, for TFLOP/s.
flop() { python3 -c "print(4 * 128 * 32 * $1 * ($2 * $3 + $2 * ($2 + 1) // 2))"; }
F4=$(flop 1 4096 0) F16=$(flop 1 16384 0) F8=$(flop 8 2048 0) FX=$(flop 1 2048 8192)
python3 "$HERE/ncu_rows.py" --every \
  "--flops=ours 1x4k:$F4,ours 1x16k:$F16,ours extend:$FX" \
  "ours 1x4k=$L/ncu_ours_1x4k.log" "ours 1x16k=$L/ncu_ours_1x16k.log" \
  "ours extend=$L/ncu_ours_8kprefix.log" > "$OUT/ncu_rows.txt" 2>&1
python3 "$HERE/ncu_rows.py" --every "cuDNN=$L/ncu_cudnn.log" "FA3=$L/ncu_fa3.log" \
  >> "$OUT/ncu_rows.txt" 2>&1
echo "(cuDNN / FA3 launches in order; flop counts: 1x4k $F4, 1x16k $F16, 8x2k $F8, extend $FX)" \
  >> "$OUT/ncu_rows.txt"
{
  echo "== GPU:"
  cat "$L/gpu.txt"
  echo "== tests"
  grep -H -E '^\[  (PASSED|FAILED) |^\[  FAILED|tests? ran' "$L/gemv_rope.log" "$L/gemv.log" \
    "$L/engine_fold.log"
  echo "== decode step A/B (batch 1, ms per step)"
  for f in "$L"/ab_*.log; do echo "$(basename "$f" .log): $(grep -E '^ +1 +1024' "$f")"; done
  echo "== trace"
  cat "$L/dsb_trace.log" "$L/dsb_trace_rope0.log"
  echo "== cuDNN calls profiled"
  grep -E '^(not )?profiled' "$L/ncu_cudnn.log"
  echo "== ncu (--clock-control none)"
  cat "$OUT/ncu_rows.txt"
} >> "$OUT/summary.txt"
(cd "$OUT" && tar czf logs.tar.gz logs ncu_fa3.txt* 2> /dev/null)
(cd "$OUT" && rm -rf logs ncu_fa3.txt*)
cat "$OUT/summary.txt"
