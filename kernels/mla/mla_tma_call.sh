#!/usr/bin/env bash
# Issue 33's MLA decode kernel check in one device call on nvidia-h200-x4 (4 GPUs), from the
# repository root:
#   kernels/mla/mla_tma_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/mla:mla_tensor_core_cuda_test //kernels/mla:mla_rows16_cuda_test //kernels/mla:mla_plan_cuda_test //kernels/mla:mla_plain_fp8_cuda_test //kernels/mla:mla_cuda_bench
# tool//runtime:generate tool//runtime/model:make_dummy_model, tarred and xz-compressed.
# Jobs, in parallel, each under its own timeout (the call within ~100 s):
#   GPU 0  mla_cuda_test (every case: mma.sync, wgmma cp.async, wgmma TMA, FP8, DCP), then ncu on
#          the two wgmma kernels at 16 heads, 64 x 16k
#   GPU 1  compute-sanitizer racecheck: mla_cuda_bench --tma=1 (small), then the test's
#          TensorCoreKernelDecodeAndVerify (all three tensor-core kernels)
#   GPU 2  tests/gpu/mla_fp8_cuda_golden.sh PARTS=base
#   GPU 3  mla_cuda_bench: 128 and 16 heads, cp.async vs TMA, batch 1/16/64/128 x ctx
#          1k/4k/16k/64k; FP8 pools (plain kernel); then ncu at 128 heads, 64 x 16k
# Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_tma_out}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/mla_tma_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
echo "extracted in $((SECONDS - T0)) s"
nvidia-smi -L > "$LOG/gpus.txt" 2>&1 || echo "no GPU (nvidia-smi failed)"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
export MLA_BIN_DIR=$BD/bin/kernels/mla  # mla_cuda_test is four binaries now
T=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tests/gpu/mla_cuda_tests.sh
B=$BD/bin/kernels/mla/mla_cuda_bench
CS=/usr/local/cuda/bin/compute-sanitizer
NCU=/usr/local/cuda/bin/ncu
ls -l "$CS" "$NCU" > "$LOG/tools.txt" 2>&1

NCU_ARGS=(--kernel-name regex:'Mla(Tma|Wgmma)Kernel' --launch-skip 3 --launch-count 1
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats)
gpu0() {
  timeout 40 "$T" > "$LOG/test.txt" 2>&1
  echo "rc $?" >> "$LOG/test.txt"
  for tma in 0 1; do
    timeout 25 "$NCU" "${NCU_ARGS[@]}" "$B" --heads=16 --tma=$tma --batches=64 \
      --contexts=16384 > "$LOG/ncu16_tma$tma.txt" 2>&1
  done
}
gpu1() {
  timeout 35 "$CS" --tool racecheck "$B" --heads=16 --tma=1 --batches=3 --contexts=300,1000 \
    > "$LOG/race_bench.txt" 2>&1
  echo "rc $?" >> "$LOG/race_bench.txt"
  timeout 55 "$CS" --tool racecheck "$T" --gtest_filter='*DecodeAndVerify*' \
    > "$LOG/race_test.txt" 2>&1
  echo "rc $?" >> "$LOG/race_test.txt"
}
gpu2() {
  PARTS=base timeout 75 tests/gpu/mla_fp8_cuda_golden.sh "$BD" "$LOG/base" > "$LOG/base.txt" 2>&1
  echo "rc $?" >> "$LOG/base.txt"
}
gpu3() {
  local all=("--batches=1,16,64,128" "--contexts=1024,4096,16384,65536")
  for h in 128 16; do
    for tma in 0 1; do
      timeout 20 "$B" --heads=$h --tma=$tma "${all[@]}" > "$LOG/bench_h${h}_tma$tma.txt" 2>&1
    done
  done
  timeout 10 "$B" --heads=16 --fp8=1 --batches=16,64 --contexts=4096,16384 \
    > "$LOG/bench_h16_fp8.txt" 2>&1
  timeout 8 "$B" --heads=128 --fp8=1 --batches=16 --contexts=4096 > "$LOG/bench_h128_fp8.txt" 2>&1
  for tma in 0 1; do
    timeout 12 "$NCU" "${NCU_ARGS[@]}" "$B" --heads=128 --tma=$tma --batches=64 \
      --contexts=16384 > "$LOG/ncu128_tma$tma.txt" 2>&1
  done
}
CUDA_VISIBLE_DEVICES=0 gpu0 &
CUDA_VISIBLE_DEVICES=1 gpu1 &
CUDA_VISIBLE_DEVICES=2 gpu2 &
CUDA_VISIBLE_DEVICES=3 gpu3 &
wait
{
  echo "== device: $(head -n 1 "$LOG/gpus.txt"); wall $((SECONDS - T0)) s"
  grep -E "^\[  (PASSED|FAILED) |^\[ +OK|FAILED|rc " "$LOG/test.txt" | head -n 20
  echo "== racecheck"
  grep -E "RACECHECK SUMMARY|rc |Error" "$LOG/race_bench.txt" "$LOG/race_test.txt" | head
  echo "== base"
  grep -E "passed|PASS|FAIL|rc " "$LOG/base.txt" | head -n 20
  for f in "$LOG"/bench_*.txt; do
    echo "== $(basename "$f")"
    cat "$f"
  done
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
