#!/usr/bin/env bash
# Issue 33's unabsorbed CUDA MLA prefill (mla_unabsorbed_cuda.cu) in one device call on
# nvidia-h200, from the repository root:
#   kernels/mla/mla_prefill_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/mla:mla_prefill_cuda_test
# //kernels/mla:mla_tensor_core_cuda_test //kernels/mla:mla_rows16_cuda_test //kernels/mla:mla_plan_cuda_test //kernels/mla:mla_plain_fp8_cuda_test //kernels/mla:mla_prefill_cuda_bench
# //kernels/attention/cuda:paged_prefill_cuda_test, tarred and xz-compressed.
# In order, each under its own timeout: mla_prefill_cuda_test; mla_prefill_cuda_bench on its
# default grid (16 / 128 heads x prefix 0 / 1k / 4k / 16k x chunk 512 / 2k) and on a chunk grid
# (64-1024) for the crossover; nsys's kernel breakdown of both forms at 128 heads, 16k + 2k; then
# mla_cuda_test (the existing kernels), paged_prefill_cuda_test (the prefill kernel gained a
# 192 / 128 variant) and compute-sanitizer memcheck of the unabsorbed path (a small bench config)
# side by side. Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_prefill_out}
LOG=$OUT/logs
mkdir -p "$LOG"
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/mla_prefill_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
echo "extracted in $((SECONDS - T0)) s"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
P=$BD/bin/kernels/mla/mla_prefill_cuda_test
export MLA_BIN_DIR=$BD/bin/kernels/mla  # mla_cuda_test is four binaries now
T=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tests/gpu/mla_cuda_tests.sh
PP=$BD/bin/kernels/attention/cuda/paged_prefill_cuda_test
B=$BD/bin/kernels/mla/mla_prefill_cuda_bench
CS=/usr/local/cuda/bin/compute-sanitizer
NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys 2>/dev/null)
{ nvidia-smi -L; ls -l "$CS" "$NSYS"; } > "$LOG/env.txt" 2>&1

step() {  # NAME SECONDS CMD...: one step under its timeout, rc and seconds appended
  local name=$1 limit=$2 t=$SECONDS; shift 2
  timeout "$limit" "$@" > "$LOG/$name.txt" 2>&1
  echo "rc $? in $((SECONDS - t)) s" >> "$LOG/$name.txt"
}
step prefill_test 60 "$P"
step bench 60 "$B"
step bench_chunks 40 "$B" --chunks=64,128,256,1024 --prefixes=0,4096
if [[ -n $NSYS ]]; then
  step nsys 35 "$NSYS" profile --stats=true -o "$OUT/prof" --force-overwrite true "$B" \
    --heads=128 --prefixes=16384 --chunks=2048 --iters=2
  rm -f "$OUT"/prof.*
fi
step mla_cuda_test 75 "$T" &
step paged_prefill_test 60 "$PP" &
step memcheck 50 "$CS" --tool memcheck "$B" --heads=16 --prefixes=100 --chunks=70 --iters=1 &
wait
{
  echo "total $((SECONDS - T0)) s"
  for f in "$LOG"/*.txt; do
    echo "== $(basename "$f"): $(tail -n 1 "$f")"
  done
  grep -h "PASSED\|FAILED\|ERROR SUMMARY" "$LOG"/*.txt
  cat "$LOG/bench.txt" "$LOG/bench_chunks.txt"
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
cat "$OUT/summary.txt"
