#!/usr/bin/env bash
# The block-scaled FP8 GEMM on wgmma (fp8_block_gemm_cuda.h) in one device call on nvidia-h200,
# from the repository root:
#   kernels/fp8/fp8_block_gemm_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/fp8:fp8_gemm_cuda_test
# //kernels/fp8:fp8_cuda_bench, plus the baseline fp8_cuda_bench as DIR/bin/old_fp8_cuda_bench,
# tarred and xz-compressed. Steps, each under its own timeout (~2 minutes in all):
#   1. fp8_gemm_cuda_test, seed 1 (every case), seed 2 (the wgmma cases);
#   2. compute-sanitizer memcheck on the wgmma cases (seed 3), where the tool is there;
#   3. fp8_cuda_bench --only=block: baseline, new, baseline, new (the new binary's rows carry
#      cuBLASLt's block kernel and both wgmma forms beside per-tensor FP8 and bf16).
# Logs under $OUT (logs.tar.gz); a summary at the end of the output.
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/fp8_block_out}
LOG=$OUT/logs
mkdir -p "$LOG"
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/fp8_block_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
echo "extracted in $((SECONDS - T0)) s"
nvidia-smi > "$LOG/gpu.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
T=$BD/bin/kernels/fp8/fp8_gemm_cuda_test
NEW=$BD/bin/kernels/fp8/fp8_cuda_bench
OLD=$BD/bin/old_fp8_cuda_bench
CS=/usr/local/cuda/bin/compute-sanitizer

TANDEM_TEST_SEED=1 timeout 60 "$T" > "$LOG/test_seed1.txt" 2>&1
echo "rc $?" >> "$LOG/test_seed1.txt"
TANDEM_TEST_SEED=2 timeout 30 "$T" --gtest_filter='*Wgmma*' > "$LOG/test_seed2.txt" 2>&1
echo "rc $?" >> "$LOG/test_seed2.txt"
echo "tests done at $((SECONDS - T0)) s"
if [[ -x $CS ]]; then
  TANDEM_TEST_SEED=3 timeout 30 "$CS" --tool memcheck "$T" --gtest_filter='*Wgmma*' \
    > "$LOG/memcheck.txt" 2>&1
  echo "rc $?" >> "$LOG/memcheck.txt"
else
  echo "no compute-sanitizer" > "$LOG/memcheck.txt"
fi
echo "memcheck done at $((SECONDS - T0)) s"
for i in 1 2; do
  timeout 40 "$OLD" --only=block > "$LOG/bench_old_$i.txt" 2>&1
  echo "rc $?" >> "$LOG/bench_old_$i.txt"
  timeout 60 "$NEW" --only=block > "$LOG/bench_new_$i.txt" 2>&1
  echo "rc $?" >> "$LOG/bench_new_$i.txt"
  echo "bench round $i done at $((SECONDS - T0)) s"
done
(cd "$OUT" && tar czf logs.tar.gz logs && rm -rf logs)
tar xzf "$OUT/logs.tar.gz" -C /tmp
S=/tmp/logs
grep -h "PASSED\|FAILED\|SKIPPED \]\|largest error\|^rc" "$S"/test_seed*.txt | head -40
grep -h "ERROR SUMMARY\|^rc\|no compute" "$S/memcheck.txt" | head -5
for f in "$S"/bench_*.txt; do
  echo "== $(basename "$f")"
  cat "$f"
done
echo "total $((SECONDS - T0)) s"
