#!/usr/bin/env bash
# The MLA kernel tests that were one binary, mla_cuda_test, until the sixteenth session split it
# by role: runs mla_tensor_core_cuda_test, mla_rows16_cuda_test, mla_plan_cuda_test and
# mla_plain_fp8_cuda_test from MLA_BIN_DIR (a bundle's bin/kernels/mla) with the same arguments
# (a --gtest_filter selects across all four; a binary with no match runs nothing and passes).
# Exits non-zero if any fails. The older call scripts in kernels/mla set T to this script.
set -uo pipefail
: "${MLA_BIN_DIR:?set MLA_BIN_DIR to the bundle's bin/kernels/mla}"
rc=0
for t in mla_tensor_core_cuda_test mla_rows16_cuda_test mla_plan_cuda_test mla_plain_fp8_cuda_test; do
  "$MLA_BIN_DIR/$t" "$@" || rc=1
done
exit $rc
