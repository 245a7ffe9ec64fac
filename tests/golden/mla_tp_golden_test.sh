#!/usr/bin/env bash
# Tensor parallelism for DeepSeek MLA against transformers: `generate --tp=N` (N rank processes
# over Gloo on loopback, each loading only its heads, MLP slice and vocabulary rows; the latent
# whole on every rank) on MLA fixtures, all prompts as one batch: greedy tokens identical and
# last-prompt logits within 1e-4 * max to transformers (compare_generate.py). TP 4 is one head
# per rank; the MoE fixtures split every expert's intermediate rows. DCP for MLA is refused.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures_mla

run() {  # VARIANT TP OUT
  local fix=$FIXTURES/$1
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos \
    --dump_last_logits --tp="$2" --num_threads=1 >"$3" 2>"$3.err" ||
    {
      echo "FAIL: $1 tp=$2"
      cat "$3.err"
      exit 1
    }
}

for case in deepseek_v2_f32:2 deepseek_v3_f32:4 deepseek_v2_lite_f32:2 deepseek_v3_moe_f32:2; do
  variant=${case%:*}
  tp=${case#*:}
  echo "$variant tp=$tp"
  run "$variant" "$tp" "$T/$variant.$tp.jsonl"
  python3 "$COMPARE" "$T/$variant.$tp.jsonl" "$FIXTURES/$variant/expected.json"
done

if timeout 60 "$GENERATE" --model="$FIXTURES/deepseek_v3_f32" --prompt_ids=5,6 --max_tokens=2 \
  --tp=2 --dcp=2 >"$T/dcp.out" 2>"$T/dcp.err"; then
  echo "FAIL: MLA with --dcp=2 exited 0"
  exit 1
fi
grep -q "decode context parallelism for multi-head latent attention" "$T/dcp.err" ||
  {
    echo "FAIL: no DCP refusal in:"
    cat "$T/dcp.err"
    exit 1
  }
echo "ok: MLA --dcp=2 refused"
