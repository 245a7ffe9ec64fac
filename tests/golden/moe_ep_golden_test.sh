#!/usr/bin/env bash
# Expert parallelism over the TP ranks through the generate CLI: `--tp=N --enable_expert_parallel`
# (N rank processes over Gloo on loopback, each holding its experts whole; attention split by
# heads; one all-reduce per MoE layer) on the Mixtral fixture (4 experts: one per rank at N=4),
# the Qwen3-MoE fixture (8 experts, q/k norms, a dense layer) and the DeepSeek-V3 MoE fixture
# (MLA, 8 routed experts in 4 groups, a shared expert, sigmoid + bias routing): greedy tokens
# identical and last-prompt logits within 1e-4 * max to transformers and to TP=1, at N = 2 and 4.
# Then startup refusals naming the numbers: 4 ranks for 6 experts, a dense model, and a
# pre-sharded (TP-sliced) checkpoint. (CUDA: tests/gpu/moe_ep_cuda_golden.sh.)
set -euo pipefail
GENERATE=$1
COMPARE=$2
SHARD=$3
T=${TEST_TMPDIR:-$(mktemp -d)}

# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"
run() {  # FIXTURE_DIR TP OUT [FLAGS...]
  run_generate 16 "$@"
}

for fix in tests/golden/fixtures/mixtral_f32 tests/golden/fixtures/qwen3_moe_f32 \
    tests/golden/fixtures_mla/deepseek_v3_moe_f32; do
  name=$(basename "$fix")
  run "$fix" 1 "$T/$name.1.jsonl"
  for ep in 2 4; do
    echo "$name tp=$ep --enable_expert_parallel"
    run "$fix" "$ep" "$T/$name.ep$ep.jsonl" --enable_expert_parallel
    grep -q "expert parallelism, [0-9]* experts over $ep ranks" "$T/$name.ep$ep.jsonl.err" ||
      { echo "FAIL: no placement line in the log"; cat "$T/$name.ep$ep.jsonl.err"; exit 1; }
    python3 "$COMPARE" "$T/$name.ep$ep.jsonl" "$fix/expected.json"
    python3 "$COMPARE" --run "$T/$name.ep$ep.jsonl" "$T/$name.1.jsonl" tp=1
  done
done

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
refused "the group's 4 ranks do not divide the model's 6 experts" \
  --model=tests/golden/fixtures/qwen2_moe_f32 --tp=4 --enable_expert_parallel
refused "needs a mixture-of-experts model; LlamaForCausalLM has no experts" \
  --model=tests/golden/fixtures/llama_f32_gqa --enable_expert_parallel
# A pre-sharded checkpoint holds slices of every expert, not whole ones.
"$SHARD" --model=tests/golden/fixtures/qwen3_moe_f32 --tp=2 --out="$T/qwen3_moe_tp2" > /dev/null 2>&1
refused "is pre-sharded (each rank a slice of every expert), but --enable_expert_parallel" \
  --model="$T/qwen3_moe_tp2" --tp=2 --enable_expert_parallel
echo PASS
