#!/usr/bin/env bash
# MoeGroupedWgmma (issue 32's prefill grouped GEMM on Hopper's wgmma) in one device call on
# nvidia-h200, from the repository root:
#   tests/gpu/moe_wgmma_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR //kernels/moe:moe_cuda_layer_test
#   //kernels/moe:moe_cuda_bench [tool//runtime:generate], tar'd and xz'd. Env: BENCH_TOKENS
#   (default 128,512,1024,2048,8192), NCU=0 (no ncu step), E2E_SECONDS (default 150). Steps, each
#   under its own timeout:
#   1. moe_cuda_layer_test's GroupedWgmmaMatchesCpu alone (a hang shows here first); the rest
#      only when it passed:
#   2. the whole test (the layer on every path, the wgmma one included);
#   3. moe_cuda_bench at BENCH_TOKENS (old | new | wgmma columns of one process, every
#      MoeWgmmaProducer, the wgmma experts checked against cuBLAS's grouped call: wg_err);
#   4. ncu's speed-of-light rows of the two wgmma launches at Qwen3-30B-A3B x 8192 tokens (when
#      ncu is there);
#   5. with generate in the bundle, moe_wgmma_e2e.sh (the kernel in real model steps), its runs
#      started within E2E_SECONDS of the call's start.
# Logs under $OUT/logs (tarred to $OUT/logs.tar.gz); the summary to stdout.
set -uo pipefail
T0=$SECONDS
export OUT=${OUT:-/tmp/moe_wgmma_out} TANDEM_REQUIRE_GPU=1
# shellcheck source-path=SCRIPTDIR source=device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/device_call_lib.sh"
BD=/tmp/moe_wgmma_bundle
bundle_call_start "$(realpath "${1:?bundle .tar.xz}")" "$BD"
export LD_LIBRARY_PATH="$BD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
device_line
K=$BD/bin/kernels/moe

step wgmma_test 40 "$K/moe_cuda_layer_test" --gtest_filter='*GroupedWgmma*'
wg_rc=$step_rc
tail -n 5 "$LOG/wgmma_test.txt"
if [[ $wg_rc == 0 ]]; then
  step layer_test 60 "$K/moe_cuda_layer_test"
  grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) " "$LOG/layer_test.txt"
  step bench 100 "$K/moe_cuda_bench" --tokens="${BENCH_TOKENS:-128,512,1024,2048,8192}" --iters=10
  cat "$LOG/bench.txt"
  if [[ ${NCU:-1} != 0 && -x /usr/local/cuda/bin/ncu ]]; then
    step ncu 60 /usr/local/cuda/bin/ncu --kernel-name regex:GroupedWgmma --launch-count 2 \
      --section SpeedOfLight "$K/moe_cuda_bench" --tokens=8192 --iters=1
    grep -E "GroupedWgmma|Duration|Throughput|Block Size|Grid Size" "$LOG/ncu.txt" | head -n 30
  fi
fi
if [[ -x $BD/bin/runtime/generate ]]; then
  "$(dirname "${BASH_SOURCE[0]}")/moe_wgmma_e2e.sh" "$BD" "$LOG/e2e" \
    $((${E2E_SECONDS:-150} - (SECONDS - T0)))
fi
tar czf "$OUT/logs.tar.gz" -C "$LOG" .
echo "== total wall $((SECONDS - T0)) s"
