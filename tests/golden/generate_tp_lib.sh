# shellcheck shell=bash
# Shared by the generate-CLI tensor-parallel golden tests (fp8_tp_golden_test.sh,
# moe_ep_golden_test.sh); sourced, not run. Needs GENERATE (the generate binary).
#
# run_generate MAX_TOKENS FIXTURE_DIR TP OUT [FLAGS...]: generate on the fixture's prompts
#   (expected.json) at --tp=TP with last-prompt logits, JSON lines to OUT, stderr to OUT.err; on
#   failure prints the command and OUT.err and exits the test with 1.

run_generate() {
  local max_tokens=$1 fix=$2 tp=$3 out=$4
  shift 4
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens="$max_tokens" \
    --ignore_eos --dump_last_logits --tp="$tp" --num_threads=1 "$@" > "$out" 2> "$out.err" ||
    { echo "FAIL: $fix tp=$tp $*"; cat "$out.err"; exit 1; }
}
