#!/usr/bin/env bash
# Issue 38: the batch-1 W8A16 GEMV's ring forms (Fp8W16Math::kRing / kRing2 / kRingHalf,
# kernels/fp8/fp8_w8a16_ring_cuda.cu) in one device call on nvidia-h200 (one GPU), <= ~60 s:
#   tests/gpu/fp8_w16_ring_call.sh [BUNDLE_DIR]    (default: the current directory)
# BUNDLE_DIR: tests/gpu/bundle.sh DIR //kernels/fp8:fp8_w8a16_gemv_ring_cuda_test
#   //kernels/fp8:fp8_gemv_cuda_bench //runtime/cuda:decode_step_bench, plus the session start's
#   binaries (8e54faa: /tmp/start_bin10/{fp8_gemv_cuda_bench,decode_step_bench}) copied to
#   DIR/old/. Steps, each under its own timeout (logs under $OUT/gfp8, a summary to stdout):
#   test        fp8_w8a16_gemv_ring_cuda_test --gtest_filter=*Ring* (the ring forms vs
#               cpu::Fp8Linear and vs kTensorCore's bits at odd shapes and the Llama-3-8B / 70B projections; the
#               fp32 / tensor-core cases are left out: their SASS is unchanged since they passed);
#   gemv_old    the start binary's fp8_gemv_cuda_bench --only=w8a16 (bf16, W8A8, fp32, mma rows);
#   gemv_new    this tree's, the mma and the three ring inner loops only;
#   d_*         decode_step_bench Llama-3-8B, context 1024, 32 steps: old / new (switch off) at
#               bf16 + FP8 batch 1 and 8, then new with TANDEM_FP8_W16_MMA=ring / ring2 /
#               ringhalf (FP8 batch 1; ring also batch 8, which runs W8A8 and must not move);
#               time permitting, the fastest ring form's --trace=1 breakdown (16 steps) and a
#               second off / fastest round at FP8 batch 1.
# A ring kernel that hangs traps after ~1 s (MbarWaitOrTrap); if the test times out or reports a
# launch failure, every later ring step is skipped (the call stays short).
set -uo pipefail
T0=$SECONDS
B=$(cd "${1:-.}" && pwd)
export OUT=${OUT:-/tmp/gfp8_out} TANDEM_REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0 CUDA_VISIBLE_DEVICES=0
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
LOG=$OUT/gfp8
mkdir -p "$LOG"
nvidia-smi -L > "$LOG/gpus.txt" 2>&1
echo "== device: $(head -n 1 "$LOG/gpus.txt")"

# step NAME SECONDS CMD...: CMD under timeout into $LOG/NAME.txt; "== NAME: rc RC in S s".
step() {
  local name=$1 secs=$2 t0=$SECONDS
  shift 2
  timeout "$secs" "$@" > "$LOG/$name.txt" 2>&1
  step_rc=$?
  echo "== $name: rc $step_rc in $((SECONDS - t0)) s (call at $((SECONDS - T0)) s)"
}

step test 40 "$B/bin/kernels/fp8/fp8_w8a16_gemv_ring_cuda_test" --gtest_filter="*Ring*"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) |Failure|Expected|Which is|col |math=" "$LOG/test.txt" |
  head -n 40
RING=1
if ((step_rc == 124)) || grep -qiE "launch failure|illegal|unspecified|trap" "$LOG/test.txt"; then
  RING=0
  echo "== ring kernels hang or fault: the ring steps below are skipped"
fi

# Kernel rows: us and weight TB/s per (shape, variant); the step's folded forms with early loads
# first.
rows() {
  grep -E "^w8a16 " "$LOG/$1.txt" | grep -E -e "$2" |
    awk '{printf "%-4s %-8s %-28s %8s %6s\n", $2, $3, $6, $7, $8}'
}
if [[ -x $B/old/fp8_gemv_cuda_bench ]]; then
  step gemv_old 20 "$B/old/fp8_gemv_cuda_bench" --only=w8a16 --reps=20 --iters=10
  rows gemv_old "w8a16-mma-folded-early|w8a16-mma-early|bf16-folded"
fi
if ((RING)); then
  step gemv_new 25 "$B/bin/kernels/fp8/fp8_gemv_cuda_bench" --only=w8a16 --reps=20 --iters=10 \
    --w8a16_math=mma,ring,ring2,ringhalf --w8a16_ref=0
  rows gemv_new "-folded-early|-early"
fi

# Decode steps: "batch context step_ms tok/s ..." rows per quantization.
D=(--steps=32 --context=1024)
NEW=$B/bin/runtime/cuda/decode_step_bench OLD=$B/old/decode_step_bench
decode() {
  local name=$1 secs=$2
  shift 2
  step "$name" "$secs" "$@"
  grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ |quantization|weights" "$LOG/$name.txt" | head -n 8
}
[[ -x $OLD ]] && decode d_old1 25 env -u TANDEM_FP8_W16_MMA "$OLD" "${D[@]}" --batches=1,8 \
  --quantization=none,fp8
decode d_off1 25 env -u TANDEM_FP8_W16_MMA "$NEW" "${D[@]}" --batches=1,8 --quantization=none,fp8
if ((RING)); then
  for v in ring ring2 ringhalf; do
    batches=1
    [[ $v == ring ]] && batches=1,8
    decode "d_$v" 13 env TANDEM_FP8_W16_MMA=$v "$NEW" "${D[@]}" --batches=$batches \
      --quantization=fp8
  done
  # The fastest ring form at FP8 batch 1 (step_ms of the "1 1024" row).
  best=$(for v in ring ring2 ringhalf; do
    awk -v v="$v" '$1 == 1 && $2 == 1024 {print $3, v; exit}' "$LOG/d_$v.txt"
  done | sort -n | head -n 1 | cut -d' ' -f2)
  echo "== fastest ring form at FP8 batch 1: ${best:-none}"
  if [[ -n $best ]] && ((SECONDS - T0 < 45)); then
    decode "d_${best}_trace" 10 env TANDEM_FP8_W16_MMA="$best" "$NEW" --steps=16 --context=1024 \
      --batches=1 --quantization=fp8 --trace=1
    grep -iE "gemv|w16|ring|attention|lm_head|busy" "$LOG/d_${best}_trace.txt" | head -n 20
  fi
  if [[ -n $best ]] && ((SECONDS - T0 < 50)); then
    decode d_off2 8 env -u TANDEM_FP8_W16_MMA "$NEW" "${D[@]}" --batches=1 --quantization=fp8
    decode "d_${best}2" 8 env TANDEM_FP8_W16_MMA="$best" "$NEW" "${D[@]}" --batches=1 \
      --quantization=fp8
  fi
fi
echo "== total $((SECONDS - T0)) s; logs in $LOG"
