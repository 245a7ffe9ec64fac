#!/usr/bin/env bash
# Qwen3 and the mixture-of-experts families on the CUDA backend (issue 32) against transformers:
# the golden fixtures mistral_f32, qwen3_f32, mixtral_f32, qwen3_moe_f32, qwen2_moe_f32 (random
# tiny models from tests/golden/make_golden*.py) through `generate --backend=cuda` at TP=1 and
# TP=2, by the CUDA golden rule (cuda_golden_lib.sh: last-prompt logits cosine >= 0.999 to
# transformers and to TP=1; first greedy token equal to TP=1 where its top-2 gap is >= 3% of
# max|logit|). Decode runs as CUDA graphs (generate's default); qwen3_moe_f32 is also run with
# --cuda_graphs=false, whose greedy tokens must equal the graph run's. Last, a device-dummy
# tiny-moe model at TP=2 against TP=1.
#
#   tests/gpu/moe_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env) puts rank r on GPU r (NCCL); default --tp_share_device (one GPU, Gloo).
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate. Run from the repository root.
# Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

for variant in mistral_f32 qwen3_f32 mixtral_f32 qwen3_moe_f32 qwen2_moe_f32; do
  fix=tests/golden/fixtures/$variant
  prompts=$(prompts_of "$fix/expected.json")
  if run "$LOG/$variant.1.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     compare "$variant-tp1" "$LOG/$variant.1.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json" &&
     run "$LOG/$variant.2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 $SHARE &&
     compare "$variant-tp2" "$LOG/$variant.2.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json"; then
    pass "$variant"
  else
    fail "$variant" "$LOG/$variant".*.err
  fi
done
# Graph-captured decode (the MoE layer's sync-free path under capture) against eager decode.
fix=tests/golden/fixtures/qwen3_moe_f32
prompts=$(prompts_of "$fix/expected.json")
tokens_check graphs-vs-eager "eager vs graphs" "$LOG/eager.jsonl" "$LOG/qwen3_moe_f32.1.jsonl" \
  --model="$fix" --prompt_ids="$prompts" --cuda_graphs=false
# Dummy MoE weights drawn on each rank's device (its expert slices only).
DEV=(--load_format=dummy --dummy_config=tiny-moe --dummy_seed=3 --prompt_ids="5,6,7,8,9;100,200,30;17")
if run "$LOG/moedummy.1.jsonl" "${DEV[@]}" && run "$LOG/moedummy.2.jsonl" "${DEV[@]}" --tp=2 $SHARE &&
   compare tiny-moe-device-dummy-tp2 "$LOG/moedummy.2.jsonl" "$LOG/moedummy.1.jsonl"; then
  pass "tiny-moe-device-dummy"
else
  fail "tiny-moe-device-dummy" "$LOG"/moedummy.*.err
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
