#!/usr/bin/env bash
# Data-parallel attention with expert parallelism (wide EP) through the generate CLI:
# `--tp=2 --enable_expert_parallel --dp_attention` (2 rank processes over Gloo on loopback; rank
# 0's one scheduler spreads the prompts over the two DP ranks, each running attention, dense
# layers and lm_head whole for its own requests with their KV in its own pool; each MoE layer's
# rows go to their experts' ranks by one all-to-all and back by another) on the Mixtral fixture,
# the Qwen3-MoE fixture (a dense layer, q/k norms) and the DeepSeek-V3 MoE fixture (MLA, grouped
# sigmoid + bias routing, a shared expert): greedy tokens identical and last-prompt logits within
# 1e-4 * max to transformers and to TP=1. Then one prompt alone (DP rank 1 runs an empty batch
# every step) against TP=1's line for it, and startup refusals naming the flags and numbers.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}

# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"
DP=(--enable_expert_parallel --dp_attention)

for fix in tests/golden/fixtures/mixtral_f32 tests/golden/fixtures/qwen3_moe_f32 \
    tests/golden/fixtures_mla/deepseek_v3_moe_f32; do
  name=$(basename "$fix")
  run_generate 16 "$fix" 1 "$T/$name.1.jsonl"
  echo "$name tp=2 ${DP[*]}"
  run_generate 16 "$fix" 2 "$T/$name.dp2.jsonl" "${DP[@]}"
  grep -q "data-parallel attention over 2 ranks" "$T/$name.dp2.jsonl.err" ||
    { echo "FAIL: no DP attention line in the log"; cat "$T/$name.dp2.jsonl.err"; exit 1; }
  python3 "$COMPARE" "$T/$name.dp2.jsonl" "$fix/expected.json"
  python3 "$COMPARE" --run "$T/$name.dp2.jsonl" "$T/$name.1.jsonl" tp=1
done

# One request: rank 1 holds no request in any step and still joins every MoE all-to-all.
fix=tests/golden/fixtures/qwen3_moe_f32
prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$fix/expected.json'))['prompts'][3])))")
for tp in 1 2; do
  flags=()
  [[ $tp == 2 ]] && flags=("${DP[@]}")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompt" --max_tokens=8 --ignore_eos \
    --dump_last_logits --tp="$tp" --num_threads=1 "${flags[@]}" > "$T/one.$tp.jsonl" \
    2> "$T/one.$tp.jsonl.err" || { echo "FAIL: one prompt tp=$tp"; cat "$T/one.$tp.jsonl.err"; exit 1; }
done
echo "one prompt, DP rank 1 idle"
python3 "$COMPARE" --run "$T/one.2.jsonl" "$T/one.1.jsonl" tp=1

refused() {  # EXPECTED_MESSAGE GENERATE_FLAGS...
  local want=$1
  shift
  if timeout 60 "$GENERATE" --prompt_ids="5,6" --max_tokens=2 "$@" > "$T/bad.out" \
      2> "$T/bad.err"; then
    echo "FAIL: $* exited 0"; exit 1
  fi
  grep -qF -- "$want" "$T/bad.err" || { echo "FAIL: no '$want' in:"; cat "$T/bad.err"; exit 1; }
  echo "ok: $(grep -m1 -F -- "$want" "$T/bad.err" | sed 's/.*generate: //' | cut -c1-160)"
}
refused "--dp_attention needs --enable_expert_parallel" \
  --model=tests/golden/fixtures/qwen3_moe_f32 --tp=2 --dp_attention
refused "the group's 4 ranks do not divide the model's 6 experts" \
  --model=tests/golden/fixtures/qwen2_moe_f32 --tp=4 "${DP[@]}"
echo PASS
