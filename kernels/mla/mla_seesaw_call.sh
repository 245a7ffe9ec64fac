#!/usr/bin/env bash
# The seesaw MLA decode kernel's check in one device call on nvidia-h200 (one GPU), from the
# repository root:
#   kernels/mla/mla_seesaw_call.sh BUNDLE_TAR_XZ [2]
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/mla:mla_tensor_core_cuda_test //kernels/mla:mla_rows16_cuda_test //kernels/mla:mla_plan_cuda_test //kernels/mla:mla_plain_fp8_cuda_test //kernels/mla:mla_cuda_bench,
# plus the baseline bench (built before the change) as DIR/bin/old/mla_cuda_bench; tarred, xz.
# Steps, each under its own timeout. First call (~190 s):
#   1. smoke: the seesaw kernel at 16 heads, 1 x 1k (a hang costs 20 s, not the call)
#   2. mla_cuda_test in four processes by test (every kernel, the seesaw one included), beside
#      compute-sanitizer racecheck and memcheck of the seesaw kernel (small bench configs)
#   3. mla_cuda_bench at 16 and 128 heads, batch 1/16/64/128 x ctx 1k/4k/16k/64k, interleaved:
#      old (serial TMA), new --schedule=2 (seesaw), new --schedule=0 (serial), twice
#   4. ncu on both kernels at 16 heads, 64 x 16k
# Second call ("2", within ~95 s): the same tests with the hand-off schedule too and racecheck of
# it, then the bench at 16 and 128 heads, --schedule=0 / 1 / 2 interleaved (0, 1, 2, 0, 1).
# Logs: $OUT/logs.tar.gz, re-tarred after each step (what a timeout leaves comes back).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_seesaw_out}
LOG=/tmp/mla_seesaw_logs
rm -rf "$LOG" && mkdir -p "$LOG" "$OUT"
pack() { tar czf "$OUT/logs.tar.gz" -C /tmp mla_seesaw_logs; }
TARBALL=$(realpath "${1:?bundle .tar.xz}")
BD=/tmp/mla_seesaw_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$TARBALL" -C "$BD" || { echo "FAIL extract"; exit 1; }
echo "extracted in $((SECONDS - T0)) s"
nvidia-smi -L > "$LOG/gpus.txt" 2>&1
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64"
export MLA_BIN_DIR=$BD/bin/kernels/mla  # mla_cuda_test is four binaries now
T=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tests/gpu/mla_cuda_tests.sh
B=$BD/bin/kernels/mla/mla_cuda_bench
OLD=$BD/bin/old/mla_cuda_bench
CS=/usr/local/cuda/bin/compute-sanitizer
NCU=/usr/local/cuda/bin/ncu
ls -l "$CS" "$NCU" > "$LOG/tools.txt" 2>&1

if [[ "${2:-1}" == 2 ]]; then
  timeout 10 "$B" --heads=16 --schedule=1 --batches=1,3 --contexts=1024,300 > "$LOG/smoke.txt" 2>&1
  echo "smoke rc $?" | tee -a "$LOG/smoke.txt"
  cat "$LOG/smoke.txt"
  run_test() {  # name filter
    timeout 55 "$T" --gtest_filter="$2" > "$LOG/test_$1.txt" 2>&1
    echo "rc $?" >> "$LOG/test_$1.txt"
  }
  run_test verify '*DecodeAndVerify*:*PlainKernel*:*Rope*:*Refuses*' &
  run_test edges '*TilingEdges*' &
  run_test dcp '*DcpShards*' &
  run_test fp8 '*Fp8*' &
  (timeout 50 "$CS" --tool racecheck "$B" --heads=16 --schedule=1 --graph=0 --batches=3 \
    --contexts=300,1000 > "$LOG/race.txt" 2>&1
    echo "rc $?" >> "$LOG/race.txt") &
  wait
  echo "tests done at $((SECONDS - T0)) s"
  grep -h -E "^\[  (PASSED|FAILED) |^rc |FAILED" "$LOG"/test_*.txt
  tail -n 2 "$LOG/race.txt"
  pack
  for h in 16 128; do
    for run in 0 1 2 0b 1b; do
      [[ $((SECONDS - T0)) -gt 85 ]] && break
      timeout 12 "$B" --heads=$h --schedule=${run:0:1} --batches=1,16,64,128 \
        --contexts=1024,4096,16384,65536 > "$LOG/bench${h}_s$run.txt" 2>&1
    done
  done
  echo "bench done at $((SECONDS - T0)) s"
  pack
  exit 0
fi

timeout 20 "$B" --heads=16 --schedule=2 --batches=1,3 --contexts=1024,300 > "$LOG/smoke.txt" 2>&1
SMOKE=$?
echo "smoke rc $SMOKE" | tee -a "$LOG/smoke.txt"
cat "$LOG/smoke.txt"
pack

run_test() {  # name filter
  timeout 75 "$T" --gtest_filter="$2" > "$LOG/test_$1.txt" 2>&1
  echo "rc $?" >> "$LOG/test_$1.txt"
}
run_test verify '*DecodeAndVerify*:*PlainKernel*:*Rope*:*Refuses*' &
run_test edges '*TilingEdges*' &
run_test dcp '*DcpShards*' &
run_test fp8 '*Fp8*' &
SMALL=(--heads=16 --schedule=2 --graph=0 --batches=3 "--contexts=300,1000")
(timeout 60 "$CS" --tool racecheck "$B" "${SMALL[@]}" > "$LOG/race.txt" 2>&1
  echo "rc $?" >> "$LOG/race.txt"
  timeout 30 "$CS" --tool memcheck "$B" "${SMALL[@]}" > "$LOG/memcheck.txt" 2>&1
  echo "rc $?" >> "$LOG/memcheck.txt") &
wait
echo "tests done at $((SECONDS - T0)) s"
grep -h -E "^\[  (PASSED|FAILED) |^rc |FAILED" "$LOG"/test_*.txt
tail -n 3 "$LOG/race.txt" "$LOG/memcheck.txt"
pack

ALL=("--batches=1,16,64,128" "--contexts=1024,4096,16384,65536")
for h in 16 128; do
  for round in 1 2; do
    timeout 40 "$OLD" --heads=$h "${ALL[@]}" > "$LOG/bench${h}_old_$round.txt" 2>&1
    for s in 2 0; do
      timeout 40 "$B" --heads=$h --schedule=$s "${ALL[@]}" > "$LOG/bench${h}_s${s}_$round.txt" 2>&1
    done
  done
done
echo "bench done at $((SECONDS - T0)) s"
pack

NCU_ARGS=(--kernel-name regex:'Mla(Tma|Seesaw)Kernel' --launch-skip 3 --launch-count 1
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats)
for s in 0 1; do
  timeout 30 "$NCU" "${NCU_ARGS[@]}" "$B" --heads=16 --schedule=$((2 * s)) --graph=0 --batches=64 \
    --contexts=16384 > "$LOG/ncu16_s$s.txt" 2>&1
done
echo "all done at $((SECONDS - T0)) s"
pack
