#!/usr/bin/env bash
# Speculative decoding through the generate CLI on the golden fixtures (issue 34): greedy tokens
# identical and last-prompt logits within 1e-4 * max to transformers (expected.json) and to the
# same fixture with speculation off, all prompts as one batch, at TP = 1 and 2 (2 rank processes
# over Gloo; rank 0 drafts, the group verifies):
#   * n-gram drafts, K = 1, 3, 5 at a fixed length (--speculative_adaptive=false: every step
#     verifies what the drafter finds; K = 5 under a 32-token step budget: chunked prefill beside
#     verify passes) on llama_f32_llama3_tied (whose outputs repeat themselves: a third to a half
#     of the drafts accepted); TP = 2 at K = 3;
#   * a draft model on llama_f32_gqa: the target itself (every draft accepted: a check on the
#     verifier), llama_bf16 (the same weights rounded to bf16: most drafts accepted, some
#     rejected mid-run) and a smaller random model of the same vocabulary (1 layer, hidden 32:
#     almost nothing accepted); TP = 2 with the bf16 draft;
# the speculative counters on stderr say how many drafts were accepted. Seeded sampling
# (temperature 0.8, top-p 0.9, top-k 20, --seed=7), what the design promises (speculative.h):
#   * n-gram drafts are verified by sample matching (each position sampled with the request's own
#     Philox counter), so the tokens are those of speculation off with the same seed, here at
#     TP = 2 against TP = 1 (the group's logits equal TP = 1's up to rounding; rank 0 samples);
#   * draft-model drafts are verified by rejection sampling (accept min(1, p/q), residual
#     max(0, p - q), seeded): the target's distribution, not speculation off's tokens, so a TP = 2
#     group (rank 0 runs the draft whole), run twice, gives the tokens of TP = 1 with the seed.
# (TP = 1 against itself and speculation off: speculative_engine_test, draft_model_test.)
# Then a draft model of another vocabulary exits 1 naming it.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures

# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"

# A random model of the target's vocabulary, smaller (VOCAB: another vocabulary) -> config path.
small_config() {  # OUT [VOCAB]
  python3 - "$FIXTURES/$GQA/config.json" "$1" "${2:-}" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c.update(num_hidden_layers=1, hidden_size=32, intermediate_size=64, num_attention_heads=2,
         num_key_value_heads=1)
if sys.argv[3]:
    c["vocab_size"] = int(sys.argv[3])
json.dump(c, open(sys.argv[2], "w"))
PY
}

# check OUT FIXTURE_DIR REF ACCEPTANCE [LABEL]: OUT equals transformers (FIXTURE_DIR empty: not
# compared, sampled runs) and REF (LABEL, default speculation off); the counters on OUT.err show
# drafts, and accepted ones as ACCEPTANCE says: all | some (0 < accepted < drafted) | low
# (accepted < drafted / 10).
check() {
  local out=$1 fix=$2 ref=$3 acceptance=$4 label=${5:-speculation off} line drafted accepted
  [[ -z $fix ]] || python3 "$COMPARE" "$out" "$fix/expected.json"
  python3 "$COMPARE" --run "$out" "$ref" "$label"
  line=$(grep -o "drafted [0-9]*, accepted [0-9]*" "$out.err") ||
    { echo "FAIL: no speculative counters"; cat "$out.err"; exit 1; }
  read -r drafted accepted <<< "$(echo "$line" | tr -dc '0-9 ' | tr -s ' ')"
  echo "  drafted $drafted, accepted $accepted"
  local ok=0
  case $acceptance in
    all) (( drafted > 0 && accepted == drafted )) && ok=1 ;;
    some) (( accepted > 0 && accepted < drafted )) && ok=1 ;;
    low) (( drafted > 0 && accepted * 10 < drafted )) && ok=1 ;;
  esac
  (( ok )) || { echo "FAIL: acceptance is not '$acceptance'"; exit 1; }
}

# gen FIXTURE_DIR TP OUT [FLAGS...]: run_generate of 16 tokens with a 16 MiB KV pool (these
# fixtures take 512 bytes a token; zeroing the default 256 MiB took most of each run's time).
gen() {
  run_generate 16 "$1" "$2" "$3" --kv_cache_bytes=$((16 << 20)) "${@:4}"
}

spec() {  # NAME VARIANT TP REF ACCEPTANCE FLAGS...
  local name=$1 variant=$2 fix=$FIXTURES/$2 tp=$3 ref=$4 acceptance=$5
  shift 5
  echo "$name: $variant tp=$tp $*"
  gen "$fix" "$tp" "$T/$name.jsonl" "$@"
  check "$T/$name.jsonl" "$fix" "$ref" "$acceptance"
}

# sampled NAME VARIANT TP REF LABEL ACCEPTANCE FLAGS...: spec's run, seeded sampling, against REF.
SAMPLE=(--temperature=0.8 --top_p=0.9 --top_k=20 --seed=7)
sampled() {
  local name=$1 variant=$2 fix=$FIXTURES/$2 tp=$3 ref=$4 label=$5 acceptance=$6
  shift 6
  echo "$name: $variant tp=$tp ${SAMPLE[*]} $*"
  gen "$fix" "$tp" "$T/$name.jsonl" "${SAMPLE[@]}" "$@"
  check "$T/$name.jsonl" "" "$ref" "$acceptance" "$label"
}

TIED=llama_f32_llama3_tied
GQA=llama_f32_gqa
small_config "$T/small.json"
NGRAM=(--speculative_method=ngram)
FIXED=(--speculative_adaptive=false)
DRAFT=(--speculative_method=draft --speculative_adaptive=false)

gen "$FIXTURES/$TIED" 1 "$T/tied.off.jsonl"
gen "$FIXTURES/$GQA" 1 "$T/gqa.off.jsonl"
for k in 1 3; do
  spec "ngram$k" "$TIED" 1 "$T/tied.off.jsonl" some "${NGRAM[@]}" "${FIXED[@]}" \
    --num_speculative_tokens="$k"
done
spec ngram5.budget "$TIED" 1 "$T/tied.off.jsonl" some "${NGRAM[@]}" "${FIXED[@]}" \
  --num_speculative_tokens=5 --max_num_batched_tokens=32
spec draft.target "$GQA" 1 "$T/gqa.off.jsonl" all "${DRAFT[@]}" \
  --num_speculative_tokens=3 --draft_model="$FIXTURES/$GQA"
spec draft.bf16 "$GQA" 1 "$T/gqa.off.jsonl" some "${DRAFT[@]}" \
  --num_speculative_tokens=5 --draft_model="$FIXTURES/llama_bf16"
spec draft.small "$GQA" 1 "$T/gqa.off.jsonl" low "${DRAFT[@]}" \
  --num_speculative_tokens=3 --draft_model="dummy:$T/small.json:5"

# TP = 2 against TP = 1 with speculation off (the TP rows of tp_golden_test: within 1e-4).
spec tp2.ngram3 "$TIED" 2 "$T/tied.off.jsonl" some "${NGRAM[@]}" "${FIXED[@]}" \
  --num_speculative_tokens=3
spec tp2.draft.bf16 "$GQA" 2 "$T/gqa.off.jsonl" some "${DRAFT[@]}" \
  --num_speculative_tokens=5 --draft_model="$FIXTURES/llama_bf16"

# Seeded sampling. The sampled reference differs from greedy (something was sampled).
gen "$FIXTURES/$TIED" 1 "$T/tied.sampled.jsonl" "${SAMPLE[@]}"
if python3 "$COMPARE" --run "$T/tied.sampled.jsonl" "$T/tied.off.jsonl" greedy > /dev/null; then
  echo "FAIL: sampled tokens equal the greedy ones"; exit 1
fi
sampled s.tp2.ngram3 "$TIED" 2 "$T/tied.sampled.jsonl" "TP = 1 speculation off, same seed" some \
  "${NGRAM[@]}" "${FIXED[@]}" --num_speculative_tokens=3
BF16=(--num_speculative_tokens=3 --draft_model="$FIXTURES/llama_bf16")
gen "$FIXTURES/$GQA" 1 "$T/s.draft.bf16.jsonl" "${SAMPLE[@]}" "${DRAFT[@]}" "${BF16[@]}"
for run in 1 2; do
  sampled "s.tp2.draft.bf16.$run" "$GQA" 2 "$T/s.draft.bf16.jsonl" "TP = 1, same seed" some \
    "${DRAFT[@]}" "${BF16[@]}"
done

small_config "$T/vocab256.json" 256
if "$GENERATE" --model="$FIXTURES/$GQA" --prompt_ids=5,6 --max_tokens=2 "${DRAFT[@]}" \
    --num_speculative_tokens=3 --draft_model="dummy:$T/vocab256.json" > /dev/null \
    2> "$T/bad.err"; then
  echo "FAIL: a draft of another vocabulary exited 0"; exit 1
fi
grep -q "vocab" "$T/bad.err" || { echo "FAIL: no vocabulary in:"; cat "$T/bad.err"; exit 1; }
echo "ok: another vocabulary -> $(grep "vocab" "$T/bad.err" | head -1 | cut -c1-200)"
echo PASS
