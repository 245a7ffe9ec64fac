#!/usr/bin/env bash
# Tensor parallelism on the CUDA backend with one GPU: `generate --backend=cuda --tp=2
# --tp_share_device` (two rank processes on the same GPU, their all-reduces and logits gather
# staged through host memory over Gloo) against `--tp=1` on the same GPU and against
# transformers, on every golden fixture (computed in bf16 / f16 by the CUDA backend).
# Criteria (the CUDA golden rule, tests/golden/README.md): last-prompt logits cosine >= 0.999
# to transformers and to TP=1; first greedy token equal to TP=1 wherever TP=1's top-2 gap is
# >= 3% of max|logit|; reported: greedy tokens equal to TP=1, prompt by prompt.
# Also a dummy Llama-shaped model (llama-100m) at TP=2 vs TP=1 by the same logits rule.
#
#   tests/gpu/tp_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env) puts rank r on GPU r instead, the collectives then over NCCL (--tp_comm=auto)
# (a machine with >= 4 GPUs for the TP=4 run; with 2, the TP=4 run shares: TP4_FLAGS). Default SHARE=--tp_share_device.
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate tool//runtime/model:make_dummy_model. Run from the repository root
# (reads tests/golden/fixtures). Prints "N passed, N failed, N skipped".
set -uo pipefail
B=$(cd "${1:?bundle dir}" && pwd)
LOG=${2:?log dir}
mkdir -p "$LOG"
export LD_LIBRARY_PATH="$B/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
G=$B/bin/runtime/generate
SHARE=${SHARE---tp_share_device}
TP4_FLAGS=${TP4_FLAGS-$SHARE}
passed=0 failed=0 skipped=0
if ! nvidia-smi -L > /dev/null 2>&1; then
  echo "no GPU: skipped"; echo "0 passed, 0 failed, 1 skipped"; exit 0
fi

compare() {  # NAME OUT REF [EXPECTED_JSON]
  python3 - "$@" <<'PY'
import json, math, sys
name, out, ref = sys.argv[1:4]
exp = json.load(open(sys.argv[4])) if len(sys.argv) > 4 else None
got = [json.loads(l) for l in open(out) if l.strip()]
want = [json.loads(l) for l in open(ref) if l.strip()]
assert len(got) == len(want) > 0
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
bad, same_tokens, worst_ref, worst_hf = 0, 0, 1.0, 1.0
for i, (g, w) in enumerate(zip(got, want)):
    lg, lw = g["last_prompt_logits"], w["last_prompt_logits"]
    c = cos(lg, lw); worst_ref = min(worst_ref, c)
    if c < 0.999: print(f"{name} prompt {i}: cosine to tp=1 {c:.5f}"); bad += 1
    if exp is not None:
        ch = cos(lg, exp["last_prompt_logits"][i]); worst_hf = min(worst_hf, ch)
        if ch < 0.999: print(f"{name} prompt {i}: cosine to transformers {ch:.5f}"); bad += 1
    top = sorted(lw, reverse=True)
    if top[0] - top[1] >= 0.03 * max(abs(x) for x in lw) and g["tokens"][0] != w["tokens"][0]:
        print(f"{name} prompt {i}: first token {g['tokens'][0]} != tp=1 {w['tokens'][0]}"); bad += 1
    same_tokens += g["tokens"] == w["tokens"]
print(f"{name}: {len(got)} prompts, cosine to tp=1 >= {worst_ref:.6f}"
      + (f", to transformers >= {worst_hf:.6f}" if exp else "")
      + f", greedy tokens equal to tp=1 on {same_tokens}/{len(got)}, {bad} failures")
sys.exit(1 if bad else 0)
PY
}

run() {  # OUT ARGS...
  local out=$1; shift
  timeout 300 "$G" --backend=cuda --kv_cache_bytes=268435456 --max_tokens=16 --ignore_eos \
    --dump_last_logits --num_threads=1 "$@" > "$out" 2> "$out.err"
}

for variant in llama_f32_gqa llama_f32_mqa_headdim_bias llama_f32_llama3_tied qwen2_f32 llama_bf16 \
               qwen2_f16; do
  fix=tests/golden/fixtures/$variant
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  if run "$LOG/$variant.1.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     run "$LOG/$variant.2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 $SHARE &&
     compare "$variant" "$LOG/$variant.2.jsonl" "$LOG/$variant.1.jsonl" "$fix/expected.json"; then
    echo "PASS $variant"; passed=$((passed + 1))
  else
    echo "FAIL $variant"; tail -3 "$LOG/$variant.2.jsonl.err"; failed=$((failed + 1))
  fi
done
# Random Llama-shaped weights written as a checkpoint (the device dummy generator draws whole
# tensors, so TP ranks read the same files instead).
"$B/bin/runtime/model/make_dummy_model" --config=llama-100m --dtype=bfloat16 --seed=1 \
  --out="$LOG/llama100m" > "$LOG/make_dummy.out" 2>&1
DUMMY=(--model="$LOG/llama100m" --prompt_ids="5,6,7,8,9;100,200,300;17")
if run "$LOG/dummy.1.jsonl" "${DUMMY[@]}" && run "$LOG/dummy.2.jsonl" "${DUMMY[@]}" --tp=2 $SHARE &&
   run "$LOG/dummy.4.jsonl" "${DUMMY[@]}" --tp=4 $TP4_FLAGS &&
   compare llama-100m-tp2 "$LOG/dummy.2.jsonl" "$LOG/dummy.1.jsonl" &&
   compare llama-100m-tp4 "$LOG/dummy.4.jsonl" "$LOG/dummy.1.jsonl"; then
  echo "PASS llama-100m"; passed=$((passed + 1))
else
  echo "FAIL llama-100m"; tail -3 "$LOG"/dummy.*.err; failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
