#!/usr/bin/env bash
# Tensor parallelism against transformers: `generate --tp=N` (N rank processes over Gloo on
# loopback, each loading only its shard) on every f32 fixture at TP = 1, 2, 4 (4: the GQA
# fixtures' 2 KV heads and the MQA fixture's 1 are replicated), all prompts as one batch:
#   greedy tokens identical and last-prompt logits within 1e-4 * max to transformers
#   (compare_generate.py) and to TP=1; the f16 fixture (stored f16, computed in f32) at TP=2
#   against TP=1 by the same rule. Then topologies that cannot work exit 1 naming the numbers,
#   and ranks that load different models refuse to start, naming the rank.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures

compare_tp() {  # OUT REF: same tokens, logits within 1e-4 * max|ref|
  python3 "$COMPARE" --run "$1" "$2" tp=1
}

run() {  # VARIANT TP OUT
  local fix=$FIXTURES/$1
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos \
    --dump_last_logits --tp="$2" --num_threads=1 > "$3" 2> "$3.err" ||
    { echo "FAIL: $1 tp=$2"; cat "$3.err"; exit 1; }
}

for variant in llama_f32_gqa llama_f32_mqa_headdim_bias llama_f32_llama3_tied qwen2_f32 \
               llama_f32_old_format; do
  for tp in 1 2 4; do
    echo "$variant tp=$tp"
    run "$variant" "$tp" "$T/$variant.$tp.jsonl"
    python3 "$COMPARE" "$T/$variant.$tp.jsonl" "$FIXTURES/$variant/expected.json"
    [[ $tp == 1 ]] || compare_tp "$T/$variant.$tp.jsonl" "$T/$variant.1.jsonl"
  done
done
# 8 query / 4 KV heads: KV heads split over 2 and 4 ranks, replicated (2 ranks each) over 8.
for tp in 1 2 4 8; do
  echo "llama_f32_gqa8x4 tp=$tp"
  run llama_f32_gqa8x4 "$tp" "$T/gqa8x4.$tp.jsonl"
  python3 "$COMPARE" "$T/gqa8x4.$tp.jsonl" "$FIXTURES/llama_f32_gqa8x4/expected.json"
  [[ $tp == 1 ]] || compare_tp "$T/gqa8x4.$tp.jsonl" "$T/gqa8x4.1.jsonl"
done
echo "qwen2_f16 tp=2 vs tp=1"
run qwen2_f16 1 "$T/f16.1.jsonl"
run qwen2_f16 2 "$T/f16.2.jsonl"
compare_tp "$T/f16.2.jsonl" "$T/f16.1.jsonl"

expect_fail() {  # description, expected text, args...
  local what=$1 text=$2; shift 2
  if timeout 60 "$GENERATE" "$@" > "$T/bad.out" 2> "$T/bad.err"; then
    echo "FAIL: $what exited 0"; exit 1
  fi
  grep -q -- "$text" "$T/bad.err" || { echo "FAIL: $what: no '$text' in:"; cat "$T/bad.err"; exit 1; }
  echo "ok: $what -> $(grep -- "$text" "$T/bad.err" | head -1 | cut -c1-200)"
}
GQA=$FIXTURES/llama_f32_gqa
expect_fail "tp not dividing heads" "--tp=3 does not divide the model's 4 attention heads" \
  --model="$GQA" --prompt_ids="5,6" --max_tokens=2 --tp=3
expect_fail "tp beyond the heads" "--tp=8 does not divide the model's 4 attention heads" \
  --model="$GQA" --prompt_ids="5,6" --max_tokens=2 --tp=8
expect_fail "world size disagreeing with tp" "--world_size=3 disagrees with --tp=2" \
  --model="$GQA" --prompt_ids="5,6" --max_tokens=2 --tp=2 --rank=0 --world_size=3 \
  --dist_init=127.0.0.1:1
expect_fail "bad dist_init" "--dist_init must be HOST:PORT" \
  --model="$GQA" --prompt_ids="5,6" --max_tokens=2 --tp=2 --rank=1 --dist_init=nowhere

# Two ranks started by hand (the launcher form) with different models: both refuse, naming rank 1.
port=$(python3 -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
timeout 60 "$GENERATE" --model="$FIXTURES/qwen2_f32" --prompt_ids="5" --max_tokens=2 --tp=2 \
  --rank=1 --dist_init=127.0.0.1:$port --dist_timeout_s=20 > /dev/null 2> "$T/rank1.err" &
rank1=$!
expect_fail "ranks with different models" "rank(s) 1 loaded something else than rank 0" \
  --model="$GQA" --prompt_ids="5" --max_tokens=2 --tp=2 --rank=0 --dist_init=127.0.0.1:$port \
  --dist_timeout_s=20
if wait "$rank1"; then echo "FAIL: rank 1 with another model exited 0"; exit 1; fi
grep -q "loaded something else than rank 0" "$T/rank1.err" ||
  { echo "FAIL: rank 1 said:"; cat "$T/rank1.err"; exit 1; }
echo PASS
