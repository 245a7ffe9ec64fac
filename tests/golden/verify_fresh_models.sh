#!/usr/bin/env bash
# Checks the generate CLI against transformers on freshly generated models (not the committed
# fixtures): every variant of make_golden.py with its weight seeds shifted by OFFSET.
# Needs a Python with torch + transformers (PYTHON) and a built //runtime:generate.
#
#   PYTHON=/path/to/venv/bin/python tests/golden/verify_fresh_models.sh OFFSET [OUT_DIR]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
OFFSET=${1:?usage: verify_fresh_models.sh OFFSET [OUT_DIR]}
OUT=${2:-$(mktemp -d)}
mkdir -p "$OUT"
PYTHON=${PYTHON:-python3}
cd "$ROOT"
bazel build --noshow_progress //runtime:generate >/dev/null 2>&1
GEN=$(bazel info bazel-bin 2>/dev/null)/runtime/generate
"$PYTHON" tests/golden/make_golden.py --out "$OUT" --seed_offset "$OFFSET" > "$OUT/make_golden.log" || true
status=0
for dir in "$OUT"/*/; do
  name=$(basename "$dir")
  dtype=$(python3 -c "import json; print(json.load(open('$dir/expected.json'))['dtype'])")
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$dir/expected.json'))['prompts']))")
  "$GEN" --model="$dir" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos --dump_last_logits \
    > "$OUT/$name.jsonl"
  if [[ $dtype == float32 ]]; then
    if python3 tests/golden/compare_generate.py "$OUT/$name.jsonl" "$dir/expected.json" > "$OUT/$name.cmp"; then
      echo "$name (seed offset $OFFSET): $(tail -n 1 "$OUT/$name.cmp")"
    else
      echo "$name (seed offset $OFFSET): MISMATCH"; cat "$OUT/$name.cmp"; status=1
    fi
  else
    python3 - "$OUT/$name.jsonl" "$dir/expected.json" <<'PY'
import json, math, sys
got = [json.loads(l) for l in open(sys.argv[1])]
exp = json.load(open(sys.argv[2]))
worst_cos, top1 = 1.0, 0
for g, w, w32 in zip(got, exp["last_prompt_logits"], exp["last_prompt_logits_f32_compute"]):
    a = g["last_prompt_logits"]
    dot = sum(x * y for x, y in zip(a, w)); na = math.sqrt(sum(x * x for x in a)); nw = math.sqrt(sum(y * y for y in w))
    worst_cos = min(worst_cos, dot / (na * nw))
    top1 += max(range(len(a)), key=a.__getitem__) == max(range(len(w32)), key=w32.__getitem__)
print(f"{exp['variant']} ({exp['dtype']}): min cosine vs transformers {worst_cos:.6f}, "
      f"top-1 vs fp32-compute {top1}/{len(got)}")
sys.exit(0 if worst_cos >= 0.999 and top1 == len(got) else 1)
PY
  fi
done
exit $status
