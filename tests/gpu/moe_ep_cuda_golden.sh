#!/usr/bin/env bash
# Expert parallelism over the TP ranks on the CUDA backend (issue 32 item 3a; runtime/cuda/
# cuda_moe_mlp.h: each rank's experts whole plus one zero expert, MoeLocalizeRouting): the golden
# fixtures mixtral_f32 (4 experts: 2 per rank) and qwen3_moe_f32 (8 experts) through
# `generate --backend=cuda --tp=2 --enable_expert_parallel` against transformers and the CUDA
# TP=1 run, by the CUDA golden rule (cuda_golden_lib.sh); qwen3_moe_f32 under EP eager
# (--cuda_graphs=false) must give the graph run's tokens; a device-dummy tiny-moe model at
# --tp=2 --enable_expert_parallel (each rank draws its own experts) against TP=1.
# EP (b), data-parallel attention + EP (item 3b; runtime/cuda/cuda_moe_all_to_all.h): the same
# fixtures at `--tp=2 --enable_expert_parallel --dp_attention` (each rank its own requests, the
# MoE rows dispatched and combined by all-to-alls) against TP=1 and transformers by the same rule;
# one prompt alone (DP rank 1 idle in every step, still joining every layer's collectives)
# against its TP=1 run; the device-dummy tiny-moe model under DP against TP=1. DP decode steps
# run padded to the step's largest DP batch with the fixed-capacity dispatch, as CUDA graphs
# (CudaBackendConfig::dp_attention_graphs); the same padded steps eager (--cuda_graphs=false)
# must give the graph run's tokens. The DeepSeek-V3 MoE fixture (MLA) under DP against TP=1 and
# transformers, eager against graphs.
#
# ROWS=dp (env): only the EP (b) rows (and the TP=1 runs they compare against).
#
#   tests/gpu/moe_ep_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env) puts rank r on GPU r (NCCL); default --tp_share_device (one GPU, Gloo).
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate. Run from the repository root.
# Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

ROWS=${ROWS:-all}
for variant in mixtral_f32 qwen3_moe_f32; do
  fix=tests/golden/fixtures/$variant
  prompts=$(prompts_of "$fix/expected.json")
  if [[ $ROWS == dp ]]; then
    run "$LOG/$variant.1.jsonl" --model="$fix" --prompt_ids="$prompts"
    continue
  fi
  if run "$LOG/$variant.1.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     run "$LOG/$variant.ep2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 \
       --enable_expert_parallel $SHARE &&
     compare "$variant-ep2" "$LOG/$variant.ep2.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json"
  then
    pass "$variant"
  else
    fail "$variant" "$LOG/$variant".*.err
  fi
done
fix=tests/golden/fixtures/qwen3_moe_f32
prompts=$(prompts_of "$fix/expected.json")
DEV=(--load_format=dummy --dummy_config=tiny-moe --dummy_seed=3 --prompt_ids="5,6,7,8,9;100,200,30;17")
if [[ $ROWS == dp ]]; then
  run "$LOG/epdummy.1.jsonl" "${DEV[@]}"
else
  tokens_check ep-graphs-vs-eager "EP eager vs graphs" "$LOG/ep_eager.jsonl" \
    "$LOG/qwen3_moe_f32.ep2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 \
    --enable_expert_parallel --cuda_graphs=false $SHARE
  if run "$LOG/epdummy.1.jsonl" "${DEV[@]}" &&
     run "$LOG/epdummy.2.jsonl" "${DEV[@]}" --tp=2 --enable_expert_parallel $SHARE &&
     compare tiny-moe-device-dummy-ep2 "$LOG/epdummy.2.jsonl" "$LOG/epdummy.1.jsonl"; then
    pass "tiny-moe-device-dummy-ep2"
  else
    fail "tiny-moe-device-dummy-ep2" "$LOG"/epdummy.*.err
  fi
fi
DP=(--tp=2 --enable_expert_parallel --dp_attention)
for variant in mixtral_f32 qwen3_moe_f32; do
  fix=tests/golden/fixtures/$variant
  if run "$LOG/$variant.dp2.jsonl" --model="$fix" --prompt_ids="$(prompts_of "$fix/expected.json")" \
       "${DP[@]}" $SHARE &&
     grep -q "data-parallel attention over 2 ranks" "$LOG/$variant.dp2.jsonl.err" &&
     compare "$variant-dp2" "$LOG/$variant.dp2.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json"
  then
    pass "$variant-dp-attention"
  else
    fail "$variant-dp-attention" "$LOG/$variant.dp2.jsonl.err"
  fi
done
# DeepSeek-V3's MoE fixture (MLA attention whole on each DP rank, grouped sigmoid + bias routing,
# a shared expert: CudaMlaModel under --dp_attention) against its TP=1 run and transformers; a
# prompt whose last-token routing is a bf16 near-tie may match the other side's logits
# (routing_near_ties.json, as mla_cuda_golden.sh); its eager padded steps give the graphs' tokens.
fix=tests/golden/fixtures_mla/deepseek_v3_moe_f32
near=()
[[ -f $fix/routing_near_ties.json ]] && near=("$fix/routing_near_ties.json")
prompts=$(prompts_of "$fix/expected.json")
if run "$LOG/mla_moe.1.jsonl" --model="$fix" --prompt_ids="$prompts" &&
   run "$LOG/mla_moe.dp2.jsonl" --model="$fix" --prompt_ids="$prompts" "${DP[@]}" $SHARE &&
   grep -q "data-parallel attention over 2 ranks" "$LOG/mla_moe.dp2.jsonl.err" &&
   compare deepseek_v3_moe_f32-dp2 "$LOG/mla_moe.dp2.jsonl" "$LOG/mla_moe.1.jsonl" \
     "$fix/expected.json" ${near[@]+"${near[@]}"}; then
  pass "deepseek_v3_moe_f32-dp-attention"
else
  fail "deepseek_v3_moe_f32-dp-attention" "$LOG"/mla_moe.*.err
fi
tokens_check mla-dp-graphs-vs-eager "MLA EP (b) padded eager vs graphs" "$LOG/mla_moe_eager.jsonl" \
  "$LOG/mla_moe.dp2.jsonl" --model="$fix" --prompt_ids="$prompts" "${DP[@]}" --cuda_graphs=false \
  $SHARE
fix=tests/golden/fixtures/qwen3_moe_f32
prompts=$(prompts_of "$fix/expected.json")
tokens_check dp-graphs-vs-eager "EP (b) padded eager vs graphs" "$LOG/dp_eager.jsonl" \
  "$LOG/qwen3_moe_f32.dp2.jsonl" --model="$fix" --prompt_ids="$prompts" "${DP[@]}" \
  --cuda_graphs=false $SHARE
one=$(python3 -c "import json; print(','.join(map(str, json.load(open('$fix/expected.json'))['prompts'][3])))")
if run "$LOG/dp_one.1.jsonl" --model="$fix" --prompt_ids="$one" &&
   run "$LOG/dp_one.dp2.jsonl" --model="$fix" --prompt_ids="$one" "${DP[@]}" $SHARE &&
   compare dp-one-prompt-idle-rank "$LOG/dp_one.dp2.jsonl" "$LOG/dp_one.1.jsonl"; then
  pass "dp-attention-idle-rank"
else
  fail "dp-attention-idle-rank" "$LOG"/dp_one.*.err
fi
if run "$LOG/epdummy.dp2.jsonl" "${DEV[@]}" "${DP[@]}" $SHARE &&
   compare tiny-moe-device-dummy-dp2 "$LOG/epdummy.dp2.jsonl" "$LOG/epdummy.1.jsonl"; then
  pass "tiny-moe-device-dummy-dp2"
else
  fail "tiny-moe-device-dummy-dp2" "$LOG/epdummy.dp2.jsonl.err"
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
