#!/usr/bin/env bash
# Data-parallel attention with expert parallelism (wide EP) through the generate CLI:
# `--tp=2 --enable_expert_parallel --dp_attention` (2 rank processes over Gloo on loopback; rank
# 0's one scheduler spreads the prompts over the two DP ranks, each running attention, dense
# layers and lm_head whole for its own requests with their KV in its own pool; each MoE layer's
# rows go to their experts' ranks by one all-to-all and back by another) on the Mixtral fixture,
# the Qwen3-MoE fixture (a dense layer, q/k norms) and the DeepSeek-V3 MoE fixture (MLA, grouped
# sigmoid + bias routing, a shared expert): greedy tokens identical and last-prompt logits within
# 1e-4 * max to transformers (which TP=1 matches token for token: moe_ep_golden_test checks it;
# so the tokens are TP=1's too, without spending CI time on TP=1 runs here). Then one prompt
# alone (DP rank 1 runs an empty batch every step) against transformers' line for it, and a
# startup refusal naming the flags (the others: //runtime/engine:moe_dp_test).
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
  echo "$name tp=2 ${DP[*]}"
  run_generate 16 "$fix" 2 "$T/$name.dp2.jsonl" "${DP[@]}"
  grep -q "data-parallel attention over 2 ranks" "$T/$name.dp2.jsonl.err" ||
    { echo "FAIL: no DP attention line in the log"; cat "$T/$name.dp2.jsonl.err"; exit 1; }
  python3 "$COMPARE" "$T/$name.dp2.jsonl" "$fix/expected.json"
done

# One request: rank 1 holds no request in any step and still joins every MoE all-to-all.
fix=tests/golden/fixtures/qwen3_moe_f32
i=3
prompt=$(python3 -c "import json; print(','.join(map(str, json.load(open('$fix/expected.json'))['prompts'][$i])))")
timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompt" --max_tokens=16 --ignore_eos \
  --dump_last_logits --tp=2 --num_threads=1 "${DP[@]}" > "$T/one.jsonl" 2> "$T/one.jsonl.err" ||
  { echo "FAIL: one prompt"; cat "$T/one.jsonl.err"; exit 1; }
echo "one prompt, DP rank 1 idle"
python3 - "$T/one.jsonl" "$fix/expected.json" "$i" <<'PY'
import json, sys
got = json.loads(open(sys.argv[1]).readline())
exp = json.load(open(sys.argv[2]))
i = int(sys.argv[3])
want, ref = exp["greedy_tokens"][i], exp["last_prompt_logits"][i]
worst = max(abs(a - b) for a, b in zip(got["last_prompt_logits"], ref))
scale = max(abs(x) for x in ref)
ok = got["tokens"] == want and len(got["last_prompt_logits"]) == len(ref) and worst <= 1e-4 * scale
print(f"  tokens {'==' if got['tokens'] == want else '!='} transformers', worst logit diff "
      f"{worst / scale:.2e} of max")
sys.exit(0 if ok else 1)
PY

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
echo PASS
