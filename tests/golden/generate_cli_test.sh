#!/usr/bin/env bash
# //runtime:generate on the llama_f32_gqa fixture: every prompt in one continuous batch, output
# compared with transformers' (compare_generate.py); then bad inputs must exit 1 with a message.
set -euo pipefail
GENERATE=$1
COMPARE=$2
FIX=tests/golden/fixtures/llama_f32_gqa
T=${TEST_TMPDIR:-$(mktemp -d)}

prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$FIX/expected.json'))['prompts']))")
"$GENERATE" --model="$FIX" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos \
  --dump_last_logits > "$T/out.jsonl"
python3 "$COMPARE" "$T/out.jsonl" "$FIX/expected.json"

expect_fail() {  # description, args...
  local what=$1; shift
  if "$GENERATE" "$@" > "$T/bad.out" 2> "$T/bad.err"; then
    echo "FAIL: $what exited 0"; exit 1
  fi
  grep -q "generate: " "$T/bad.err" || { echo "FAIL: $what printed no message"; exit 1; }
  echo "ok: $what -> $(head -c 160 "$T/bad.err")"
}
expect_fail "token outside vocab" --model="$FIX" --prompt_ids="1,2,99999" --max_tokens=4
expect_fail "not a number" --model="$FIX" --prompt_ids="1,x,3" --max_tokens=4
expect_fail "empty prompt" --model="$FIX" --prompt_ids="1,2;;3" --max_tokens=4
expect_fail "too long" --model="$FIX" --prompt_ids="1,2,3" --max_tokens=100000
expect_fail "missing model" --model="$T/nope" --prompt_ids="1" --max_tokens=4
expect_fail "bad backend" --model="$FIX" --prompt_ids="1" --backend=tpu
expect_fail "bad temperature" --model="$FIX" --prompt_ids="1" --temperature=-2
echo PASS
