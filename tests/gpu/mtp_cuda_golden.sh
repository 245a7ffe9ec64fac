#!/usr/bin/env bash
# DeepSeek-V3's MTP layer drafting on the CUDA backend (issue 34; runtime/cuda/cuda_mtp_model.h):
# `generate --backend=cuda --speculative_method=mtp` on mtp_golden_test's fixture
# (tests/golden/fixtures_mtp/deepseek_v3_mtp_f32: the deepseek_v3_moe_f32 target + an MTP layer
# whose block is transformers' DeepseekV3DecoderLayer), in order of importance:
#   * runtime/cuda:cuda_mtp_test (the layer's numbers against transformers; engine MTP on = off);
#   over the target's 10 golden prompts:
#   * MTP off (graphs) by the CUDA golden rule against transformers (cuda_golden_lib.sh compare,
#     the fixture's routing near-ties) and its greedy tokens against transformers' (printed);
#   * MTP K = 1 and K = 3 (graphs), K = 3 eager (--cuda_graphs=false), and K = 3 in a TP=2 group
#     (rank 0 drafts) against TP=2 without MTP: greedy tokens equal to MTP off, prompt by prompt;
#     K = 3 with seeded sampling (temperature 0.7, top-k 20; rejection sampling on the device)
#     run twice: the same tokens;
#   * the same with a random bf16 model of DeepSeek-V3's latent width plus an MTP layer
#     (tests/gpu/configs/deepseek-v3-latent, make_dummy_model --mtp_layers=1) on a 700-token
#     prompt (the MTP catches up over chunks) and two short ones, K = 3 against MTP off;
#   * the CPU backend's MTP run of the fixture (K = 3) for its draft / accept counts beside CUDA's.
#
#   tests/gpu/mtp_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with //runtime/cuda:cuda_mtp_test tool//runtime:generate
# tool//runtime/model:make_dummy_model. SHARE="" (env) puts rank r on GPU r (NCCL); default
# --tp_share_device. Run from the repository root. Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

fix=tests/golden/fixtures_mtp/deepseek_v3_mtp_f32
ref=tests/golden/fixtures_mla/deepseek_v3_moe_f32
prompts=$(prompts_of "$ref/expected.json")
MTP=(--speculative_method=mtp)
stats() {  # ERR_FILE: generate's speculative counters line
  grep -o 'speculative: .*' "$1" || true
}
versus_transformers() {  # JSONL: greedy tokens equal to transformers', prompt by prompt (printed)
  python3 - "$1" "$ref/expected.json" <<'PY'
import json, sys
got = [json.loads(l)["tokens"] for l in open(sys.argv[1]) if l.strip()]
want = json.load(open(sys.argv[2]))["greedy_tokens"]
eq = [g == w[:len(g)] for g, w in zip(got, want)]
print(f"{sys.argv[1]}: greedy tokens equal to transformers on {sum(eq)}/{len(eq)} prompts")
PY
}

if timeout 300 "$B/bin/runtime/cuda/cuda_mtp_test" > "$LOG/cuda_mtp_test.log" 2>&1; then
  pass cuda_mtp_test
else
  fail cuda_mtp_test "$LOG/cuda_mtp_test.log"
fi
grep -E '^(target|MTP|K=)' "$LOG/cuda_mtp_test.log"
if run "$LOG/off.jsonl" --model="$fix" --prompt_ids="$prompts" &&
   compare mtp-fixture-off "$LOG/off.jsonl" "$LOG/off.jsonl" "$ref/expected.json" \
     "$ref/routing_near_ties.json"; then
  pass mtp-fixture-off
else
  fail mtp-fixture-off "$LOG/off.jsonl.err"
fi
versus_transformers "$LOG/off.jsonl"
for k in 1 3; do
  tokens_check "mtp-k$k" "MTP K=$k vs off" "$LOG/k$k.jsonl" "$LOG/off.jsonl" --model="$fix" \
    --prompt_ids="$prompts" "${MTP[@]}" --num_speculative_tokens=$k
  echo "K=$k: $(stats "$LOG/k$k.jsonl.err")"
  versus_transformers "$LOG/k$k.jsonl"
done
# Seeded sampling (temperature 0.7, top-k 20): MTP drafts come with their distributions, so the
# CUDA runner verifies them by Leviathan's rejection rule on the device, as the CPU backend does
# (kernels/sampling/rejection.h: the target's distribution is kept, not MTP off's tokens); a
# seeded request reproduces its tokens, run after run.
SAMPLED=(--model="$fix" --prompt_ids="$prompts" --temperature=0.7 --top_k=20 --seed=5)
if run "$LOG/sampled-k3.jsonl" "${SAMPLED[@]}" "${MTP[@]}" --num_speculative_tokens=3; then
  tokens_check mtp-k3-sampled "MTP K=3 seeded sampling, run twice" "$LOG/sampled-k3b.jsonl" \
    "$LOG/sampled-k3.jsonl" "${SAMPLED[@]}" "${MTP[@]}" --num_speculative_tokens=3
  echo "sampled K=3: $(stats "$LOG/sampled-k3.jsonl.err")"
else
  fail mtp-k3-sampled "$LOG/sampled-k3.jsonl.err"
fi
tokens_check mtp-k3-eager "MTP K=3 eager vs off" "$LOG/k3-eager.jsonl" "$LOG/off.jsonl" \
  --model="$fix" --prompt_ids="$prompts" "${MTP[@]}" --num_speculative_tokens=3 --cuda_graphs=false

"$B/bin/runtime/model/make_dummy_model" --config=tests/gpu/configs/deepseek-v3-latent/config.json \
  --seed=1 --mtp_layers=1 --out="$LOG/latent" > "$LOG/make_dummy.out" 2>&1
long=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 2000)) for _ in range(700)))")
LATENT=(--model="$LOG/latent" --prompt_ids="$long;5,6,7,8,9;100,200,300" --max_num_batched_tokens=256)
if run "$LOG/latent-off.jsonl" "${LATENT[@]}"; then
  tokens_check mtp-latent-k3 "latent-512 MTP K=3 vs off" "$LOG/latent-k3.jsonl" \
    "$LOG/latent-off.jsonl" "${LATENT[@]}" "${MTP[@]}" --num_speculative_tokens=3
  echo "latent K=3: $(stats "$LOG/latent-k3.jsonl.err")"
else
  fail mtp-latent-k3 "$LOG/latent-off.jsonl.err"
fi

if run "$LOG/tp2-off.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 $SHARE; then
  tokens_check mtp-k3-tp2 "MTP K=3 TP=2 vs TP=2 off" "$LOG/tp2-k3.jsonl" "$LOG/tp2-off.jsonl" \
    --model="$fix" --prompt_ids="$prompts" "${MTP[@]}" --num_speculative_tokens=3 --tp=2 $SHARE
  echo "TP=2 K=3: $(stats "$LOG/tp2-k3.jsonl.err")"
else
  fail mtp-k3-tp2 "$LOG/tp2-off.jsonl.err"
fi
timeout 300 "$G" --backend=cpu --max_tokens=16 --ignore_eos --num_threads=8 --model="$fix" \
  --prompt_ids="$prompts" "${MTP[@]}" --num_speculative_tokens=3 > "$LOG/cpu-k3.jsonl" \
  2> "$LOG/cpu-k3.jsonl.err"
echo "CPU K=3: $(stats "$LOG/cpu-k3.jsonl.err")"
versus_transformers "$LOG/cpu-k3.jsonl"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
