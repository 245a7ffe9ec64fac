#!/usr/bin/env bash
# Issue 33's FP8 latent KV on the tensor-core path (mla_decode_fp8.cu) and DCP for MLA, in one
# device call on nvidia-h200-x4 (4 GPUs), from the repository root:
#   kernels/mla/mla_fp8_tc_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/mla:mla_tensor_core_cuda_test //kernels/mla:mla_rows16_cuda_test //kernels/mla:mla_plan_cuda_test //kernels/mla:mla_plain_fp8_cuda_test //kernels/mla:mla_cuda_bench
# tool//runtime:generate tool//runtime/model:make_dummy_model
# tool//runtime/parallel/dcp_bench:dcp_bench, tarred and xz-compressed.
# Phase 1, the four GPUs in parallel, each job under its own timeout:
#   GPU 0  mla_cuda_test (decode / verify, FP8 on both kernels, plain, RoPE, refusals), then
#          mla_cuda_bench at 16 heads, batch 1/16/64/128 x ctx 1k/4k/16k/64k: bf16 (TMA kernel)
#          and FP8 (the new kernel)
#   GPU 1  mla_cuda_test TensorCoreKernelTilingEdges, then compute-sanitizer racecheck on the FP8
#          kernel (mla_cuda_bench --fp8=1, small: partial tiles, splits)
#   GPU 2  mla_cuda_test DcpShardsMatchTheCpuShards, then tests/gpu/mla_fp8_cuda_golden.sh
#          PARTS=base (the CUDA runner's FP8 pool now on the FP8 kernel)
#   GPU 3  the same at 128 heads; FP8 on the plain kernel at three cells; ncu on the FP8 and the
#          bf16 TMA kernels at 16 heads, 64 x 16k
# Phase 2, all four GPUs: dcp_bench --shape=deepseek-v3 at DCP 1 / 2 / 4.
# Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_fp8_tc_out}
LOG=$OUT/logs
mkdir -p "$LOG"
export NCCL_NVLS_ENABLE=0
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/mla_fp8_tc_bundle
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

NCU_ARGS=(--launch-skip 3 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis
  --section WarpStateStats --section SchedulerStats)
# bench GRID_TAG HEADS: bf16 (TMA kernel) and FP8 (new kernel) over the whole grid.
bench() {
  local all=("--batches=1,16,64,128" "--contexts=1024,4096,16384,65536")
  timeout 16 "$B" --heads="$1" "${all[@]}" > "$LOG/bench_h$1_bf16.txt" 2>&1
  timeout 16 "$B" --heads="$1" --fp8=1 "${all[@]}" > "$LOG/bench_h$1_fp8.txt" 2>&1
}
gpu0() {
  timeout 35 "$T" --gtest_filter='*DecodeAndVerify*:*Fp8*:*Plain*:*Rope*:*Refuses*' \
    > "$LOG/test_a.txt" 2>&1
  echo "rc $?" >> "$LOG/test_a.txt"
  bench 16
}
gpu1() {
  timeout 30 "$T" --gtest_filter='*TilingEdges*' > "$LOG/test_b.txt" 2>&1
  echo "rc $?" >> "$LOG/test_b.txt"
  timeout 28 "$CS" --tool racecheck "$B" --heads=16 --fp8=1 --batches=3 --contexts=300,1000 \
    > "$LOG/race_fp8.txt" 2>&1
  echo "rc $?" >> "$LOG/race_fp8.txt"
}
gpu2() {
  timeout 30 "$T" --gtest_filter='*Dcp*' > "$LOG/test_c.txt" 2>&1
  echo "rc $?" >> "$LOG/test_c.txt"
  PARTS=base timeout 40 tests/gpu/mla_fp8_cuda_golden.sh "$BD" "$LOG/base" > "$LOG/base.txt" 2>&1
  echo "rc $?" >> "$LOG/base.txt"
}
gpu3() {
  bench 128
  timeout 6 "$B" --heads=16 --fp8=1 --wgmma=0 --batches=16,64 --contexts=4096,16384 \
    > "$LOG/bench_h16_fp8_plain.txt" 2>&1
  timeout 5 "$B" --heads=128 --fp8=1 --wgmma=0 --batches=16 --contexts=4096 \
    > "$LOG/bench_h128_fp8_plain.txt" 2>&1
  timeout 14 "$NCU" --kernel-name regex:'MlaFp8Kernel' "${NCU_ARGS[@]}" "$B" --heads=16 --fp8=1 \
    --batches=64 --contexts=16384 > "$LOG/ncu16_fp8.txt" 2>&1
  timeout 14 "$NCU" --kernel-name regex:'MlaTmaKernel' "${NCU_ARGS[@]}" "$B" --heads=16 \
    --batches=64 --contexts=16384 > "$LOG/ncu16_tma.txt" 2>&1
}
CUDA_VISIBLE_DEVICES=0 gpu0 &
CUDA_VISIBLE_DEVICES=1 gpu1 &
CUDA_VISIBLE_DEVICES=2 gpu2 &
CUDA_VISIBLE_DEVICES=3 gpu3 &
wait
echo "phase 1 done at $((SECONDS - T0)) s"
timeout 45 "$BD/bin/runtime/parallel/dcp_bench/dcp_bench" --shape=deepseek-v3 --batch=1,8 \
  --context=32768,131072 --dcp=1,2,4 > "$LOG/dcp_bench.txt" 2>&1
echo "rc $?" >> "$LOG/dcp_bench.txt"
{
  echo "== device: $(head -n 1 "$LOG/gpus.txt"); wall $((SECONDS - T0)) s"
  for f in test_a test_b test_c; do
    grep -E "^\[  (PASSED|FAILED) |^\[ +(OK|FAILED) |rc |wgmma-fp8" "$LOG/$f.txt" | head -n 40
  done
  echo "== racecheck"
  grep -E "RACECHECK SUMMARY|rc |Error" "$LOG/race_fp8.txt" | head
  echo "== base"
  grep -E "passed|PASS|FAIL|rc " "$LOG/base.txt" | head -n 20
  for f in "$LOG"/bench_*.txt "$LOG/dcp_bench.txt"; do
    echo "== $(basename "$f")"
    cat "$f"
  done
} > "$OUT/summary.txt" 2>&1
cat "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
