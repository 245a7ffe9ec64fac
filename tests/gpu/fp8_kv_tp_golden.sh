#!/usr/bin/env bash
# FP8 K / V pools of a GQA model (--kv_cache_dtype=fp8 on CUDA: e4m3, one scale per tensor;
# runtime/cuda/README.md) in tensor- and decode-context-parallel groups: `generate --backend=cuda`
# on a head_dim-64 fixture built here by transformers (tests/golden/make_golden_moe.py --only
# mistral_f32_hd64: 4 q / 2 kv heads, so TP=2 gives each rank one KV head), against the CUDA TP=1
# FP8 run of the same call and transformers, by the CUDA golden rule loosened to FP8 KV's error as
# cuda_fp8_kv_test does for one scale per tensor (cosine >= 0.99; first token equal where the
# top-2 gap is >= 30% of max|logit|; the TP=1 FP8 run measured 0.99499 / 0.99478 to the bf16 pool
# / transformers on nvidia-h200, the split runs >= 0.9997 to it):
#   fp8-tp2          --tp=2 (each rank its KV head's codes);
#   fp8-tp2-dcp2     --tp=2 --dcp=2 (the tokens sharded over 2 ranks, each the whole KV head);
#   fp8-dcp2-chunked --tp=2 --dcp=2 --block_size=4 --max_num_batched_tokens=8 (chunked prefill
#                    reading the FP8 prefix on every shard);
#   fp8-eager        TP=1 eager decode: tokens equal to the graphs' run;
# and, as the kernels' sanity, the TP=1 bf16 pool against transformers by the plain rule.
#
#   [SHARE=""] tests/gpu/fp8_kv_tp_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env): TP rank r on GPU r over NCCL (default: --tp_share_device, one GPU, Gloo).
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate. Run from the repository root.
# Prints "N passed, N failed, N skipped".
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=cuda_golden_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

FIX=$LOG/fixtures
python3 tests/golden/make_golden_moe.py --out "$FIX" --only mistral_f32_hd64 > "$LOG/fixture.txt" 2>&1 ||
  { echo "FAIL fixture"; tail -n 3 "$LOG/fixture.txt"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
fix=$FIX/mistral_f32_hd64
exp=$fix/expected.json
P=(--model="$fix" --prompt_ids="$(prompts_of "$exp")")
fp8_check() {  # NAME OUT REF ARGS...
  local name=$1 out=$2 ref=$3; shift 3
  if run "$out" "${P[@]}" --kv_cache_dtype=fp8 "$@" &&
     COMPARE_MIN_COSINE=0.99 COMPARE_FIRST_TOKEN_GAP=0.3 compare "$name" "$out" "$ref" "$exp"; then
    pass "$name"
  else
    fail "$name" "$out.err"
  fi
}
if run "$LOG/bf16.tp1.jsonl" "${P[@]}" && compare "bf16-tp1" "$LOG/bf16.tp1.jsonl" "$LOG/bf16.tp1.jsonl" "$exp"; then
  pass "bf16-tp1"
else
  fail "bf16-tp1" "$LOG/bf16.tp1.jsonl.err"
fi
ref=$LOG/fp8.tp1.jsonl
if run "$ref" "${P[@]}" --kv_cache_dtype=fp8 &&
   COMPARE_MIN_COSINE=0.99 COMPARE_FIRST_TOKEN_GAP=0.3 compare "fp8-tp1" "$ref" "$LOG/bf16.tp1.jsonl" "$exp"; then
  pass "fp8-tp1"
  fp8_check fp8-tp2 "$LOG/fp8.tp2.jsonl" "$ref" --tp=2 $SHARE
  fp8_check fp8-tp2-dcp2 "$LOG/fp8.tp2dcp2.jsonl" "$ref" --tp=2 --dcp=2 $SHARE
  fp8_check fp8-dcp2-chunked "$LOG/fp8.dcp2chunk.jsonl" "$ref" --tp=2 --dcp=2 --block_size=4 \
    --max_num_batched_tokens=8 $SHARE
  tokens_check fp8-eager "fp8 eager vs graphs" "$LOG/fp8.eager.jsonl" "$ref" "${P[@]}" \
    --kv_cache_dtype=fp8 --cuda_graphs=false
else
  fail "fp8-tp1" "$ref.err"
fi
rm -rf "$FIX"/*/model.safetensors
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed -eq 0 ]]
