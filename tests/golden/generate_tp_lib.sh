# shellcheck shell=bash
# Shared by the generate-CLI tensor-parallel golden tests (fp8_tp_golden_test.sh,
# moe_ep_golden_test.sh); sourced, not run. Needs GENERATE (the generate binary).
#
# run_generate MAX_TOKENS FIXTURE_DIR TP OUT [FLAGS...]: generate on the fixture's prompts
#   (expected.json) at --tp=TP with last-prompt logits, JSON lines to OUT, stderr to OUT.err; on
#   failure prints the command and OUT.err and exits the test with 1.
# near_run A B LABEL: the two runs' greedy tokens identical and last-prompt logits within
#   1e-5 * max|logit| of each other, prompt by prompt (e.g. --dp_attention against TP=1: the same
#   arithmetic per token, summed in another order).
# expect_fail LABEL TEXT FLAGS...: generate with FLAGS (needs T, a scratch folder) must exit
#   non-zero with TEXT in its stderr; prints the line that says it.
# within GOT REF LABEL [differ]: FP8 KV runs (mla_ / gqa_fp8_kv_parallel_test.sh): greedy tokens
#   equal and last-prompt logits within 1e-3 * max|logit|, or, with `differ`, apart by more than
#   that somewhere (the runs are not of the same KV dtype).

run_generate() {
  local max_tokens=$1 fix=$2 tp=$3 out=$4
  shift 4
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens="$max_tokens" \
    --ignore_eos --dump_last_logits --tp="$tp" --num_threads=1 "$@" > "$out" 2> "$out.err" ||
    { echo "FAIL: $fix tp=$tp $*"; cat "$out.err"; exit 1; }
}

near_run() {
  python3 - "$1" "$2" "$3" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
assert len(a) == len(b) > 0, f"{len(a)} vs {len(b)} lines"
worst = 0.0
for i, (x, y) in enumerate(zip(a, b)):
    assert x["tokens"] == y["tokens"], f"prompt {i}: tokens {x['tokens']} != {y['tokens']}"
    lx, ly = x["last_prompt_logits"], y["last_prompt_logits"]
    assert len(lx) == len(ly)
    d = max(abs(p - q) for p, q in zip(lx, ly)) / max(abs(q) for q in ly)
    assert d <= 1e-5, f"prompt {i}: logits differ by {d:.2e} of max"
    worst = max(worst, d)
print(f"  {sys.argv[3]}: {len(a)} prompts, greedy tokens equal, logits within {worst:.1e} of max")
PY
}

expect_fail() {
  local what=$1 text=$2
  shift 2
  if timeout 60 "$GENERATE" "$@" > "$T/bad.out" 2> "$T/bad.err"; then
    echo "FAIL: $what exited 0"
    exit 1
  fi
  grep -q -- "$text" "$T/bad.err" || { echo "FAIL: $what: no '$text' in:"; cat "$T/bad.err"; exit 1; }
  echo "ok: $what -> $(grep -- "$text" "$T/bad.err" | head -1 | cut -c1-200)"
}

within() {
  python3 - "$@" <<'PY'
import json, sys
got, ref = ([json.loads(l) for l in open(p) if l.strip()] for p in sys.argv[1:3])
assert got and len(got) == len(ref), f"{len(got)} lines for {len(ref)}"
worst, same = 0.0, True
for g, r in zip(got, ref):
    scale = max(abs(x) for x in r["last_prompt_logits"])
    worst = max(worst, max(abs(a - b) for a, b in zip(g["last_prompt_logits"],
                                                      r["last_prompt_logits"])) / scale)
    same = same and g["tokens"] == r["tokens"]
if len(sys.argv) > 4:
    print(f"  {sys.argv[3]}: worst logit diff {worst:.2e} of max (must exceed 1e-3)")
    sys.exit(0 if worst > 1e-3 else 1)
print(f"  {sys.argv[3]}: tokens {'equal' if same else 'DIFFER'}, worst logit diff {worst:.2e} of max")
sys.exit(0 if same and worst <= 1e-3 else 1)
PY
}
