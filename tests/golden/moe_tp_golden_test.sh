#!/usr/bin/env bash
# Mixture-of-experts models under tensor parallelism: `generate --tp=2` (2 rank processes over
# Gloo on loopback, each holding a slice of every expert's intermediate rows and of the shared
# expert's; the router replicated) on the Qwen2-MoE fixture (shared expert, a dense and a sparse
# layer) and the Qwen3-MoE fixture (q/k norms, two sparse layers, a dense one): greedy tokens
# identical and last-prompt logits within 1e-4 * max to transformers and to TP=1. Then a TP that
# does not divide the experts' width, and more experts per token than experts, exit 1 naming the
# numbers.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures

run() {  # VARIANT TP OUT
  local fix=$FIXTURES/$1
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos \
    --dump_last_logits --tp="$2" --num_threads=1 > "$3" 2> "$3.err" ||
    { echo "FAIL: $1 tp=$2"; cat "$3.err"; exit 1; }
}

for variant in qwen2_moe_f32 qwen3_moe_f32; do
  for tp in 1 2; do
    echo "$variant tp=$tp"
    run "$variant" "$tp" "$T/$variant.$tp.jsonl"
    python3 "$COMPARE" "$T/$variant.$tp.jsonl" "$FIXTURES/$variant/expected.json"
  done
  python3 "$COMPARE" --run "$T/$variant.2.jsonl" "$T/$variant.1.jsonl" tp=1
done

# qwen3_moe_f32's experts are 24 wide: TP=4 would be 6 rows each (fine), but its 2 KV heads
# replicate; TP=8 does not divide the 4 attention heads. A width not divisible: rewrite the config.
bad=$T/bad_moe
mkdir -p "$bad"
cp "$FIXTURES/qwen2_moe_f32/"* "$bad/"
python3 - "$bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["shared_expert_intermediate_size"] = 42
json.dump(c, open(sys.argv[1], "w"))
PY
if timeout 60 "$GENERATE" --model="$bad" --prompt_ids="5,6" --max_tokens=2 --tp=4 \
    > "$T/bad.out" 2> "$T/bad.err"; then
  echo "FAIL: tp=4 with a shared expert 42 wide exited 0"; exit 1
fi
grep -q "does not divide the model's shared expert intermediate size 42" "$T/bad.err" ||
  { echo "FAIL: no message naming the shared expert's width in:"; cat "$T/bad.err"; exit 1; }
echo "ok: $(grep -m1 "does not divide" "$T/bad.err" | cut -c1-200)"
# More experts per token than experts: refused at startup naming both numbers.
python3 - "$bad/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["shared_expert_intermediate_size"] = 40
c["num_experts_per_tok"] = 7
json.dump(c, open(sys.argv[1], "w"))
PY
if timeout 60 "$GENERATE" --model="$bad" --prompt_ids="5,6" --max_tokens=2 > "$T/bad.out" \
    2> "$T/bad.err"; then
  echo "FAIL: top-k 7 of 6 experts exited 0"; exit 1
fi
grep -q "num_experts_per_tok (7) must be in \[1, num_experts = 6\]" "$T/bad.err" ||
  { echo "FAIL: no message naming top-k and the experts in:"; cat "$T/bad.err"; exit 1; }
echo "ok: $(grep -m1 "num_experts_per_tok" "$T/bad.err" | cut -c1-200)"
echo PASS
