#!/usr/bin/env bash
# Issue 33: the unabsorbed MLA prefill inside the CUDA model (runtime/cuda/cuda_mla_model.cc picks
# it by kernels/mla/mla_prefill_select.h), end to end on nvidia-h200, from the repository root:
#   kernels/mla/mla_prefill_model_call.sh BUNDLE_TAR_XZ
# BUNDLE_TAR_XZ: tests/gpu/bundle.sh DIR tool//runtime:generate
# tool//runtime/model:make_dummy_model, tarred and xz-compressed.
# A random bf16 model of DeepSeek-V3's attention widths at 16 heads (tests/gpu/configs/
# deepseek-v3-latent: latent 512 + 64, nope 128, v 128) on prompts of 700 tokens (one prefill
# step with no prefix: the unabsorbed form), 3000 tokens (chunks of the engine's step over a
# prefix) and 5 tokens, `generate --backend=cuda` against the CPU backend by the CUDA golden rule
# (tests/gpu/cuda_golden_lib.sh: last-prompt logits cosine >= 0.999, first greedy token equal
# where its top-2 gap is >= 3% of max|logit|). Logs under $OUT (logs.tar.gz + summary.txt).
set -uo pipefail
T0=$SECONDS
OUT=${OUT:-/tmp/mla_prefill_model_out}
BD=/tmp/mla_prefill_model_bundle
rm -rf "$BD" && mkdir -p "$BD"
tar xJf "$(realpath "${1:?bundle .tar.xz}")" -C "$BD" || { echo "FAIL extract"; exit 1; }
source tests/gpu/cuda_golden_lib.sh "$BD" "$OUT/logs"
"$B/bin/runtime/model/make_dummy_model" --config=tests/gpu/configs/deepseek-v3-latent/config.json \
  --seed=1 --out="$LOG/latent" > "$LOG/make_dummy.out" 2>&1
prompt() {  # N SEED: N random token ids
  python3 -c "import random; random.seed($2); print(','.join(str(random.randrange(3, 2000)) for _ in range($1)))"
}
ARGS=(--model="$LOG/latent" --prompt_ids="$(prompt 700 1);$(prompt 3000 2);5,6,7,8,9")
if run "$LOG/cuda.jsonl" "${ARGS[@]}" &&
   timeout 300 "$G" --backend=cpu --max_tokens=16 --ignore_eos --dump_last_logits \
     --num_threads=16 "${ARGS[@]}" > "$LOG/cpu.jsonl" 2> "$LOG/cpu.jsonl.err" &&
   compare latent-512-prefill "$LOG/cuda.jsonl" "$LOG/cpu.jsonl" > "$LOG/compare.txt" 2>&1; then
  pass latent-512-prefill
else
  fail latent-512-prefill "$LOG/cuda.jsonl.err" "$LOG/cpu.jsonl.err"
fi
cat "$LOG/compare.txt"
rm -rf "$LOG/latent"
{
  echo "total $((SECONDS - T0)) s"
  cat "$LOG/compare.txt"
  tail -n 5 "$LOG/cuda.jsonl.err" "$LOG/cpu.jsonl.err"
  echo "$passed passed, $failed failed, $skipped skipped"
} > "$OUT/summary.txt"
tar czf "$OUT/logs.tar.gz" -C "$OUT" logs && rm -rf "$LOG"
cat "$OUT/summary.txt"
