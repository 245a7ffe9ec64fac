#!/usr/bin/env bash
# Tensor parallelism on the CUDA backend with one GPU: `generate --backend=cuda --tp=2
# --tp_share_device` (two rank processes on the same GPU, their all-reduces and logits gather
# staged through host memory over Gloo) against `--tp=1` on the same GPU and against
# transformers, on every golden fixture (computed in bf16 / f16 by the CUDA backend).
# Criteria (the CUDA golden rule, tests/golden/README.md): last-prompt logits cosine >= 0.999
# to transformers and to TP=1; first greedy token equal to TP=1 wherever TP=1's top-2 gap is
# >= 3% of max|logit|; reported: greedy tokens equal to TP=1, prompt by prompt.
# Also a dummy Llama-shaped model (llama-100m) at TP=2 vs TP=1 by the same logits rule, from
# files and drawn on the devices (--load_format=dummy).
#
#   tests/gpu/tp_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env) puts rank r on GPU r instead, the collectives then over NCCL (--tp_comm=auto)
# (a machine with >= 4 GPUs for the TP=4 run; with 2, the TP=4 run shares: TP4_FLAGS). Default SHARE=--tp_share_device.
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate tool//runtime/model:make_dummy_model. Run from the repository root
# (reads tests/golden/fixtures). Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"
TP4_FLAGS=${TP4_FLAGS-$SHARE}

for variant in llama_f32_gqa llama_f32_mqa_headdim_bias llama_f32_llama3_tied qwen2_f32 llama_bf16 \
               qwen2_f16; do
  fix=tests/golden/fixtures/$variant
  prompts=$(prompts_of "$fix/expected.json")
  if run "$LOG/$variant.1.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     run "$LOG/$variant.2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 $SHARE &&
     compare "$variant" "$LOG/$variant.2.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json"; then
    pass "$variant"
  else
    fail "$variant" "$LOG/$variant.2.jsonl.err"
  fi
done
# Random Llama-shaped weights written as a checkpoint, every rank reading its slices.
"$B/bin/runtime/model/make_dummy_model" --config=llama-100m --dtype=bfloat16 --seed=1 \
  --out="$LOG/llama100m" > "$LOG/make_dummy.out" 2>&1
DUMMY=(--model="$LOG/llama100m" --prompt_ids="5,6,7,8,9;100,200,300;17")
if run "$LOG/dummy.1.jsonl" "${DUMMY[@]}" && run "$LOG/dummy.2.jsonl" "${DUMMY[@]}" --tp=2 $SHARE &&
   run "$LOG/dummy.4.jsonl" "${DUMMY[@]}" --tp=4 $TP4_FLAGS &&
   compare llama-100m-tp2 "$LOG/dummy.2.jsonl" "$LOG/dummy.1.jsonl" &&
   compare llama-100m-tp4 "$LOG/dummy.4.jsonl" "$LOG/dummy.1.jsonl"; then
  pass "llama-100m"
else
  echo "FAIL llama-100m"; tail -n 3 "$LOG"/dummy.*.err; failed=$((failed + 1))
fi
# Dummy weights drawn on each rank's device, its slices only (runtime/model/dummy_draw.h): the
# same seed is the same model at any TP, so TP=2 / TP=4 must match TP=1 by the same rule.
DEV=(--load_format=dummy --dummy_config=llama-100m --dummy_seed=3 --prompt_ids="5,6,7,8,9;100,200,300;17")
if run "$LOG/devdummy.1.jsonl" "${DEV[@]}" && run "$LOG/devdummy.2.jsonl" "${DEV[@]}" --tp=2 $SHARE &&
   run "$LOG/devdummy.4.jsonl" "${DEV[@]}" --tp=4 $TP4_FLAGS &&
   compare device-dummy-tp2 "$LOG/devdummy.2.jsonl" "$LOG/devdummy.1.jsonl" &&
   compare device-dummy-tp4 "$LOG/devdummy.4.jsonl" "$LOG/devdummy.1.jsonl"; then
  pass "device-dummy"
else
  echo "FAIL device-dummy"; tail -n 3 "$LOG"/devdummy.*.err; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
