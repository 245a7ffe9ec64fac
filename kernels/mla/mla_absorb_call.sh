#!/usr/bin/env bash
# Issue 33, twenty-ninth session: the W_UK / W_UV GEMVs (mla_absorb_gemv_cuda.cu) in one device
# call (nvidia-h200), each step under its own timeout, logs under $OUT/logs (the goldens' large
# logs stay on the device):
#   1. mla_absorb_cuda_test (every path against the fp64 reference, PDL behind a delayed writer)
#      and mla_tensor_core_cuda_test (the absorbed step around the latent kernels);
#   2. mla_absorb_cuda_bench, the session's start kernels (bin/old: the same bench built on them,
#      the PDL column then a plain launch) and this session's, interleaved twice: cuBLAS vs GEMV vs
#      GEMV+PDL at 16 / 128 heads x 1-16 tokens;
#   3. decode_step_bench, the start binary (bin/old) against this one, interleaved:
#      deepseek-v3-4l (128 heads; three times) and deepseek-v2-lite (16 heads; twice), batch 1 /
#      2 / 4 / 8, context 4096; the new binary also with --pdl=0;
#   4. tests/gpu/mla_cuda_golden.sh (CUDA vs the CPU backend and transformers on the MLA fixtures).
#
#   kernels/mla/mla_absorb_call.sh TARBALL     (from the repository root, on the device)
#
# TARBALL: tests/gpu/bundle.sh DIR //kernels/mla:mla_absorb_cuda_test
#   //kernels/mla:mla_tensor_core_cuda_test //kernels/mla:mla_absorb_cuda_bench
#   tool//kernels/mla:mla_cuda_bench tool//runtime/cuda:decode_step_bench tool//runtime:generate
#   tool//runtime/model:make_dummy_model, the start commit's decode_step_bench (and the bench on
#   its kernels) in DIR/bin/old/, stripped, tar'd, xz'd.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=../../tests/gpu/device_call_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../tests/gpu/device_call_lib.sh"
bundle_call_start "${1:?tarball}" /tmp/b29
B=$(dirname "$(find /tmp/b29 -name manifest.txt | head -n 1)")
export LD_LIBRARY_PATH=$B/lib:/usr/local/cuda/lib64 CUDA_VISIBLE_DEVICES=0
device_line
step absorb_test 120 "$B/bin/kernels/mla/mla_absorb_cuda_test"
step tc_test 200 "$B/bin/kernels/mla/mla_tensor_core_cuda_test"
for r in 1 2; do
  step "bench_old_$r" 60 "$B/bin/old/mla_absorb_cuda_bench"
  step "bench_new_$r" 60 "$B/bin/kernels/mla/mla_absorb_cuda_bench"
done
DS=(--batches=1,2,4,8 --context=4096 --steps=32)
for run in v3:1 lite:1 v3:2 lite:2 v3:3; do
  shape=deepseek-v3-4l
  [[ ${run%:*} == lite ]] && shape=deepseek-v2-lite
  for v in old new; do
    bin=$B/bin/old/decode_step_bench
    [[ $v == new ]] && bin=$B/bin/runtime/cuda/decode_step_bench
    step "decode_${v}_${run/:/_}" 60 "$bin" --shape=$shape "${DS[@]}"
  done
done
step decode_new_nopdl_v3 60 "$B/bin/runtime/cuda/decode_step_bench" --shape=deepseek-v3-4l \
  "${DS[@]}" --pdl=0
step golden 200 tests/gpu/mla_cuda_golden.sh "$B" "$LOG/golden"
rm -rf "$LOG/golden"
grep -hE "PASSED|FAILED" "$LOG"/absorb_test.txt "$LOG"/tc_test.txt
for f in "$LOG"/bench_*.txt; do echo "## $(basename "$f")"; grep -E "^\| [0-9]" "$f"; done
for f in "$LOG"/decode_*.txt; do
  echo "## $(basename "$f" .txt): $(grep -E "^ +[0-9]+ +4096" "$f" | awk '{printf "%s %s  ", $1, $3}')"
done
grep -E "PASS|FAIL|passed" "$LOG/golden.txt" | tail -n 16
