#!/usr/bin/env bash
# Decode context parallelism against transformers and against DCP=1: `generate --tp=N --dcp=K`
# (N rank processes over Gloo on loopback; K KV shards per attention slice, TP_A = N / K slices)
# on the f32 fixtures with at least as many heads as the split needs, all prompts as one batch:
# greedy tokens identical and last-prompt logits within 1e-4 * max to transformers
# (compare_generate.py) and to the same fixture at DCP=1. The fixtures' prompts run from 1 token
# (every shard but one empty) to past two blocks, and 16 decode steps cross block and shard
# boundaries; interleave 1 (token round robin), the block size (default) and 2 blocks; 4-token
# blocks; a chunked prefill (q_len > 1 on the shards). Then a context longer than one rank's pool
# is refused at DCP=1 (naming the numbers) and served at DCP=2, equal to a big-pool DCP=1 run,
# and the startup guards refuse every topology that could give wrong output, naming the numbers.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures

compare_ref() {  # OUT REF: same tokens, logits within 1e-4 * max|ref|
  python3 "$COMPARE" --run "$1" "$2" dcp=1
}

prompts_of() {
  python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$1/expected.json'))['prompts']))"
}

run() {  # FIXTURE OUT ARGS...
  local fix=$FIXTURES/$1 out=$2
  shift 2
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$(prompts_of "$fix")" --max_tokens=16 \
    --ignore_eos --dump_last_logits --num_threads=1 "$@" > "$out" 2> "$out.err" ||
    { echo "FAIL: $fix $*"; cat "$out.err"; exit 1; }
}

check() {  # FIXTURE NAME ARGS...
  local fix=$1 name=$2
  shift 2
  echo "$fix $*"
  run "$fix" "$T/$fix.$name.jsonl" "$@"
  grep -q "dcp=" "$T/$fix.$name.jsonl.err" || { echo "FAIL: no DCP group started"; exit 1; }
  python3 "$COMPARE" "$T/$fix.$name.jsonl" "$FIXTURES/$fix/expected.json"
  compare_ref "$T/$fix.$name.jsonl" "$T/$fix.ref.jsonl"
}

# 8 query / 4 KV heads: DCP 2 and 4 with TP_A 1, DCP 2 with TP_A 2 and 4.
run llama_f32_gqa8x4 "$T/llama_f32_gqa8x4.ref.jsonl" --tp=1
check llama_f32_gqa8x4 d2 --tp=2 --dcp=2
check llama_f32_gqa8x4 d4 --tp=4 --dcp=4
check llama_f32_gqa8x4 d2a2 --tp=4 --dcp=2
check llama_f32_gqa8x4 d2a4 --tp=8 --dcp=2
check llama_f32_gqa8x4 d2i1 --tp=2 --dcp=2 --dcp_interleave=1
check llama_f32_gqa8x4 d4i1 --tp=4 --dcp=4 --dcp_interleave=1 --block_size=4
check llama_f32_gqa8x4 d2i32 --tp=2 --dcp=2 --dcp_interleave=32 --block_size=16
check llama_f32_gqa8x4 d4b4 --tp=4 --dcp=4 --block_size=4
check llama_f32_gqa8x4 d2chunk --tp=2 --dcp=2 --block_size=4 --max_num_batched_tokens=8
# Qwen2 (q/k/v biases, 4 query / 2 KV heads): DCP 2 with TP_A 1 and 2.
run qwen2_f32 "$T/qwen2_f32.ref.jsonl" --tp=1
check qwen2_f32 d2 --tp=2 --dcp=2
check qwen2_f32 d2a2 --tp=4 --dcp=2

# A context longer than one rank's pool: 4 blocks of 16 tokens per rank (16384 bytes each), a
# 50-token prompt + 30 tokens = 5 blocks. DCP=1 refuses it naming the numbers; DCP=2 (3 blocks on
# shard 0, 2 on shard 1) serves it, token for token as a big-pool DCP=1 run.
long=$(python3 -c "print(','.join(str((i * 37 + 11) % 500) for i in range(50)))")
gen_long() {  # OUT ARGS...
  local out=$1
  shift
  timeout 120 "$GENERATE" --model="$FIXTURES/llama_f32_gqa8x4" --prompt_ids="$long" \
    --max_tokens=30 --ignore_eos --dump_last_logits --num_threads=1 "$@" > "$out" 2> "$out.err"
}
gen_long "$T/long.ref.jsonl" --tp=1 || { cat "$T/long.ref.jsonl.err"; exit 1; }
if gen_long "$T/long.small.jsonl" --tp=1 --kv_cache_bytes=65536; then
  echo "FAIL: 80 tokens fit a 64-token pool at dcp=1"; exit 1
fi
grep -q "request needs 5 KV blocks but the whole pool has 4" "$T/long.small.jsonl.err" ||
  { echo "FAIL: dcp=1 refusal said:"; cat "$T/long.small.jsonl.err"; exit 1; }
echo "ok: dcp=1 with a 4-block pool -> $(grep -o 'request needs 5 KV blocks[^;]*' "$T/long.small.jsonl.err" | head -1)"
gen_long "$T/long.dcp2.jsonl" --tp=2 --dcp=2 --kv_cache_bytes=65536 ||
  { echo "FAIL: dcp=2 with 4 blocks per rank"; cat "$T/long.dcp2.jsonl.err"; exit 1; }
compare_ref "$T/long.dcp2.jsonl" "$T/long.ref.jsonl"
echo "ok: dcp=2 serves 80 tokens over two 64-token pools"

expect_fail() {  # description, expected text, args...
  local what=$1 text=$2; shift 2
  if timeout 60 "$GENERATE" "$@" > "$T/bad.out" 2> "$T/bad.err"; then
    echo "FAIL: $what exited 0"; exit 1
  fi
  grep -q -- "$text" "$T/bad.err" || { echo "FAIL: $what: no '$text' in:"; cat "$T/bad.err"; exit 1; }
  echo "ok: $what -> $(grep -- "$text" "$T/bad.err" | head -1 | cut -c1-220)"
}
G84=$FIXTURES/llama_f32_gqa8x4
MQA=$FIXTURES/llama_f32_mqa_headdim_bias
expect_fail "dcp not dividing tp" "--dcp=3 must divide the group of --tp=4 ranks" \
  --model="$G84" --prompt_ids="5,6" --max_tokens=2 --tp=4 --dcp=3
expect_fail "dcp without a group" "--dcp=2 must divide the group of --tp=1 ranks" \
  --model="$G84" --prompt_ids="5,6" --max_tokens=2 --dcp=2
expect_fail "TP_A not dividing the KV heads" \
  "the attention split TP_A = tp / dcp = 2 does not divide the model's 1 KV heads" \
  --model="$MQA" --prompt_ids="5,6" --max_tokens=2 --tp=4 --dcp=2
expect_fail "heads not splitting over the group after the all-to-all" \
  "the model's 4 attention heads do not split over 8 ranks" \
  --model="$FIXTURES/qwen2_f32" --prompt_ids="5,6" --max_tokens=2 --tp=8 --dcp=4
expect_fail "interleave neither multiple nor divisor of the block size" \
  "--dcp_interleave=24 is neither a multiple of nor a divisor of the block size 16" \
  --model="$G84" --prompt_ids="5,6" --max_tokens=2 --tp=2 --dcp=2 --dcp_interleave=24
expect_fail "negative interleave" "--dcp_interleave must be >= 0" \
  --model="$G84" --prompt_ids="5,6" --max_tokens=2 --tp=2 --dcp=2 --dcp_interleave=-1
echo PASS
