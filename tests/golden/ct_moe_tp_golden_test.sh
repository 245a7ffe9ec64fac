#!/usr/bin/env bash
# compressed-tensors FP8 MoE checkpoints through the generate CLI at TP=2 (issue 38): the
# ct_moe_channel_dynamic fixtures (make_golden_ct_moe.py: our writer and the real
# compressed-tensors package; per-channel e4m3 experts, bf16 router) at TP=1, at --tp=2
# --enable_expert_parallel (EP (a): each rank four experts whole with their scales) and at --tp=2
# (every expert's rows split, per-channel scales with them) and at --tp=2 --enable_expert_parallel
# --dp_attention (EP (b): rows dispatched to the experts' ranks; equal to TP=1 within 1e-5 and
# token for token over 8 tokens), two rank processes over Gloo, against
# transformers quantizing activations per token as each form does (expected.json's *_act_quant;
# *_act_quant_tp2_ep / *_act_quant_tp2: at TP=2 the row-parallel o_proj / dense down_proj and,
# without EP, the experts' down_proj quantize each rank's input half per token, as vLLM's
# RowParallelLinear does): cosine >= 0.999 and the first greedy token equal where that
# reference's top-2 gap is >= 3% of max|logit|. Each TP=2 run is also checked against the TP=1
# reference (the rounding the slices add; printed, cosine >= 0.98: this random MoE's routing
# amplifies it to 0.9814 on one prompt). Then the FP8_BLOCK fixture ct_moe_block_dynamic (128 x
# 128 weight blocks, 1 x 128 activations): TP=1 and EP (b) (attention and dense MLP whole, experts
# whole) against its 1 x 128-group reference, EP (b) within 1e-5 of TP=1; --tp=2 with or without
# --enable_expert_parallel splits q_proj's 128 rows into 64 and is refused, naming the tensor.
# (~4 s)
set -euo pipefail
GENERATE=$1
T=${TEST_TMPDIR:-$(mktemp -d)}

check() {  # OUT FIXTURE LABEL MIN_COSINE GAP_FRACTION REFERENCE_SUFFIX
  python3 - "$1" "$2/expected.json" "$3" "$4" "$5" "${6:-}" <<'PY'
import json, math, sys
min_cos, gap_frac, form = float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
exp = json.load(open(sys.argv[2]))
ref, gaps = exp["last_prompt_logits_act_quant" + form], exp["top2_gap_act_quant" + form]
first = [t[0] for t in exp["greedy_tokens_act_quant" + form]]
assert len(lines) == len(ref), f"{len(lines)} lines for {len(ref)} prompts"
worst, checked = 1.0, 0
for i, (got, want) in enumerate(zip(lines, ref)):
    g = got["last_prompt_logits"]
    cos = sum(a * b for a, b in zip(g, want)) / math.sqrt(sum(a * a for a in g) *
                                                          sum(b * b for b in want))
    worst = min(worst, cos)
    gap = gaps[i] / max(abs(x) for x in want)
    print(f"    prompt {i}: cosine {cos:.6f}, token {got['tokens'][0]} vs {first[i]}, "
          f"gap/max {gap:.4f}")
    assert cos >= min_cos, f"prompt {i}: cosine {cos}"
    if gap >= gap_frac:
        assert got["tokens"][0] == first[i], f"prompt {i}: token {got['tokens'][0]} != {first[i]}"
        checked += 1
assert checked >= 1, "no prompt with a clear greedy token"
print(f"  {sys.argv[3]}: worst cosine {worst:.6f}, {checked} first tokens checked")
PY
}

# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"
for name in ct_moe_channel_dynamic ct_moe_channel_dynamic_pkg; do
  fix=tests/golden/fixtures_fp8/$name
  echo "$name"
  run_generate 8 "$fix" 1 "$T/$name.tp1.jsonl"
  check "$T/$name.tp1.jsonl" "$fix" "tp=1" 0.999 0.03
  # EP (b): each rank its own requests, attention whole, its four FP8 experts on the rows
  # dispatched to it: TP=1's arithmetic per token.
  run_generate 8 "$fix" 2 "$T/$name.dp2.jsonl" --enable_expert_parallel --dp_attention
  grep -q "data-parallel attention over 2 ranks" "$T/$name.dp2.jsonl.err" ||
    { echo "FAIL: no DP attention line in the log"; cat "$T/$name.dp2.jsonl.err"; exit 1; }
  check "$T/$name.dp2.jsonl" "$fix" "tp=2 --dp_attention" 0.999 0.03
  near_run "$T/$name.dp2.jsonl" "$T/$name.tp1.jsonl" "tp=2 --dp_attention vs tp=1"
  run_generate 1 "$fix" 2 "$T/$name.ep2.jsonl" --enable_expert_parallel
  grep -q "expert parallelism, [0-9]* experts over 2 ranks" "$T/$name.ep2.jsonl.err" ||
    { echo "FAIL: no placement line in the log"; cat "$T/$name.ep2.jsonl.err"; exit 1; }
  check "$T/$name.ep2.jsonl" "$fix" "tp=2 --enable_expert_parallel" 0.999 0.03 _tp2_ep
  check "$T/$name.ep2.jsonl" "$fix" "tp=2 --enable_expert_parallel vs the TP=1 reference" 0.98 0.10
  run_generate 1 "$fix" 2 "$T/$name.tp2.jsonl"
  check "$T/$name.tp2.jsonl" "$fix" "tp=2" 0.999 0.03 _tp2
  check "$T/$name.tp2.jsonl" "$fix" "tp=2 vs the TP=1 reference" 0.98 0.10
done
name=ct_moe_block_dynamic
fix=tests/golden/fixtures_fp8/$name
echo "$name"
run_generate 8 "$fix" 1 "$T/$name.tp1.jsonl"
check "$T/$name.tp1.jsonl" "$fix" "tp=1" 0.999 0.03
run_generate 8 "$fix" 2 "$T/$name.dp2.jsonl" --enable_expert_parallel --dp_attention
check "$T/$name.dp2.jsonl" "$fix" "tp=2 --dp_attention" 0.999 0.03
near_run "$T/$name.dp2.jsonl" "$T/$name.tp1.jsonl" "tp=2 --dp_attention vs tp=1"
cut="tp=2 cuts the 128x128 FP8 scale blocks of 'model.layers.0.self_attn.q_proj.weight'"
expect_fail "tp=2 cuts q_proj's 128-row block" "$cut" --model="$fix" --prompt_ids="5,6" --max_tokens=1 \
  --tp=2
expect_fail "tp=2 EP (a) cuts it too" "$cut" --model="$fix" --prompt_ids="5,6" --max_tokens=1 --tp=2 \
  --enable_expert_parallel
echo "PASS"
