#!/usr/bin/env bash
# Async scheduling on the CUDA backend (`generate --async_scheduling`: step s + 1 scheduled and
# launched while step s runs, its input ids copied from step s's sampled tokens on the device)
# against the synchronous engine, on every golden fixture: greedy tokens equal to the synchronous
# run's, prompt by prompt (same batches, so bit-identical), and the CUDA golden rule (logits
# cosine >= 0.999 to transformers and to the synchronous run); at TP=2 (the group's executor
# feeds the tokens on the host) by the TP rule against TP=1. Also llama-100m dummy weights drawn
# on the device: 64 greedy tokens and 64 seeded-sampling tokens (temperature 0.8, top-k 40)
# equal with the overlap on and off.
#
#   tests/gpu/async_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE (env) as in tp_cuda_golden.sh (default --tp_share_device; "" puts rank r on GPU r, NCCL);
# VARIANTS (env): the fixtures to run (default all six).
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate. Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

VARIANTS=${VARIANTS:-llama_f32_gqa llama_f32_mqa_headdim_bias llama_f32_llama3_tied qwen2_f32 llama_bf16 qwen2_f16}
for variant in $VARIANTS; do
  fix=tests/golden/fixtures/$variant
  prompts=$(prompts_of "$fix/expected.json")
  if run "$LOG/$variant.sync.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     run "$LOG/$variant.async.jsonl" --model="$fix" --prompt_ids="$prompts" --async_scheduling &&
     same_tokens "$variant async vs sync" "$LOG/$variant.async.jsonl" "$LOG/$variant.sync.jsonl" &&
     compare "$variant" "$LOG/$variant.async.jsonl" "$LOG/$variant.sync.jsonl" "$fix/expected.json" &&
     run "$LOG/$variant.async2.jsonl" --model="$fix" --prompt_ids="$prompts" --async_scheduling \
       --tp=2 $SHARE &&
     compare "$variant-tp2" "$LOG/$variant.async2.jsonl" "$LOG/$variant.sync.jsonl" \
       "$fix/expected.json"; then
    pass "$variant"
  else
    fail "$variant" "$LOG/$variant".*.err
  fi
done
DEV=(--load_format=dummy --dummy_config=llama-100m --dummy_seed=3 --max_tokens=64
     --prompt_ids="5,6,7,8,9;100,200,300;17;40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56")
run "$LOG/dev.sync.jsonl" "${DEV[@]}"
tokens_check device-dummy-greedy "greedy async vs sync" "$LOG/dev.async.jsonl" \
  "$LOG/dev.sync.jsonl" "${DEV[@]}" --async_scheduling
SAMPLE=(--temperature=0.8 --top_k=40 --seed=11)
run "$LOG/devs.sync.jsonl" "${DEV[@]}" "${SAMPLE[@]}"
tokens_check device-dummy-sampled "seeded sampling async vs sync" "$LOG/devs.async.jsonl" \
  "$LOG/devs.sync.jsonl" "${DEV[@]}" "${SAMPLE[@]}" --async_scheduling
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
