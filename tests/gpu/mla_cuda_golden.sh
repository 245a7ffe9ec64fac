#!/usr/bin/env bash
# DeepSeek-V2/V3 multi-head latent attention on the CUDA backend (issue 33; runtime/cuda/
# cuda_mla_model.h, kernels/mla CUDA): `generate --backend=cuda` (bf16, decode as CUDA graphs)
# against the CPU backend and transformers on the MLA golden fixtures (tests/golden/
# fixtures_mla: V2 with q_lora, V2-Lite-like without q_lora + YaRN mscale, V3 with q_lora + YaRN +
# rope_interleave, V3 rotate-half, every layer a dense MLP; and the V2 / V3 MoE fixtures, MoE
# layers through CudaMoeMlp: not yet run on a GPU when added), by the CUDA golden rule
# (cuda_golden_lib.sh: last-prompt logits cosine >= 0.999 to the CPU run and to transformers;
# first greedy token equal to the CPU run's where its top-2 gap is >= 3% of max|logit|; a MoE
# fixture's prompt whose last-token routing is a bf16 near-tie, per its routing_near_ties.json,
# may instead match transformers' logits for the other side of the tie, and says so). Then
# deepseek_v3_f32 eager (--cuda_graphs=false), whose greedy tokens must equal the graph run's,
# and a random bf16 model of DeepSeek-V3's latent width (tests/gpu/configs/deepseek-v3-latent:
# 512 + 64, the tensor-core kernel) on a 700-token prompt (split-KV, page boundaries) against
# the CPU backend by the same logits rule. Tensor parallelism: deepseek_v2_lite_f32,
# deepseek_v3_f32 and deepseek_v3_moe_f32 at --tp=2 against TP=1 and transformers. Device dummy
# weights (--load_format=dummy, drawn on the GPU, each rank its slices): tiny-mla (dense) and
# the deepseek_v3_moe_f32 config (MoE layers) at TP=1 against the CPU backend's host draw of the
# same values, and at TP=2 against TP=1.
#
#   tests/gpu/mla_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env) puts rank r on GPU r (NCCL); default --tp_share_device (one GPU, Gloo).
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate tool//runtime/model:make_dummy_model.
# Run from the repository root. Prints "N passed, N failed, N skipped".
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

# The MoE fixtures' routing near-ties (tests/golden/moe_routing_near_ties.py): a prompt whose last
# token's expert choice is closer than bf16 can resolve must match transformers' logits for one
# side of the tie (NEAR_TIES_DIR/<variant>.json overrides the committed file).
near_ties() {  # FIXTURE_DIR: NEAR=(the near-ties file) when the fixture has one, else NEAR=()
  local f=$1/routing_near_ties.json
  [[ -n ${NEAR_TIES_DIR:-} && -f $NEAR_TIES_DIR/$(basename "$1").json ]] &&
    f=$NEAR_TIES_DIR/$(basename "$1").json
  NEAR=()
  if [[ -f $f ]]; then NEAR=("$f"); fi
}
cpu() {  # OUT ARGS...: the same generate on the CPU backend (the reference run)
  local out=$1; shift
  timeout 300 "$G" --backend=cpu --max_tokens=16 --ignore_eos --dump_last_logits \
    --num_threads=8 "$@" > "$out" 2> "$out.err"
}

for variant in deepseek_v2_f32 deepseek_v2_lite_f32 deepseek_v3_f32 deepseek_v3_rotate_half_f32 \
               deepseek_v2_moe_f32 deepseek_v3_moe_f32; do
  fix=tests/golden/fixtures_mla/$variant
  prompts=$(prompts_of "$fix/expected.json")
  near_ties "$fix"
  if run "$LOG/$variant.cuda.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     cpu "$LOG/$variant.cpu.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     compare "$variant" "$LOG/$variant.cuda.jsonl" "$LOG/$variant.cpu.jsonl" "$fix/expected.json" \
       ${NEAR[@]+"${NEAR[@]}"}; then
    pass "$variant"
  else
    echo "FAIL $variant"; tail -n 3 "$LOG/$variant".*.err; failed=$((failed + 1))
  fi
done
fix=tests/golden/fixtures_mla/deepseek_v3_f32
prompts=$(prompts_of "$fix/expected.json")
tokens_check eager-vs-graphs "eager vs graphs" "$LOG/eager.jsonl" \
  "$LOG/deepseek_v3_f32.cuda.jsonl" --model="$fix" --prompt_ids="$prompts" --cuda_graphs=false
"$B/bin/runtime/model/make_dummy_model" --config=tests/gpu/configs/deepseek-v3-latent/config.json \
  --seed=1 --out="$LOG/latent" > "$LOG/make_dummy.out" 2>&1
long=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 2000)) for _ in range(700)))")
LATENT=(--model="$LOG/latent" --prompt_ids="$long;5,6,7,8,9;100,200,300")
if run "$LOG/latent.cuda.jsonl" "${LATENT[@]}" && cpu "$LOG/latent.cpu.jsonl" "${LATENT[@]}" &&
   compare latent-512 "$LOG/latent.cuda.jsonl" "$LOG/latent.cpu.jsonl"; then
  pass "latent-512"
else
  echo "FAIL latent-512"; tail -n 3 "$LOG"/latent.*.err; failed=$((failed + 1))
fi
# Tensor parallelism: Hq/2 heads per rank over the whole latent (the same latent rows cached on
# both ranks), sliced MLP / experts.
for variant in deepseek_v2_lite_f32 deepseek_v3_f32 deepseek_v3_moe_f32; do
  fix=tests/golden/fixtures_mla/$variant
  prompts=$(prompts_of "$fix/expected.json")
  near_ties "$fix"
  if run "$LOG/$variant.tp2.jsonl" --model="$fix" --prompt_ids="$prompts" --tp=2 $SHARE &&
     compare "$variant-tp2" "$LOG/$variant.tp2.jsonl" "$LOG/$variant.cuda.jsonl" "$fix/expected.json" \
       ${NEAR[@]+"${NEAR[@]}"}; then
    pass "$variant-tp2"
  else
    fail "$variant-tp2" "$LOG/$variant".tp2.jsonl.err
  fi
done
# Device dummy weights: the GPU's draw equals the CPU backend's host draw (same seed), TP=2 = TP=1.
for dummy in tiny-mla tests/golden/fixtures_mla/deepseek_v3_moe_f32/config.json; do
  name=$(basename "$(dirname "$dummy")")
  [[ $dummy == tiny-mla ]] && name=tiny-mla
  DEV=(--load_format=dummy --dummy_config="$dummy" --dummy_seed=3 --prompt_ids="5,6,7,8,9;100,200,30;17")
  if run "$LOG/dummy-$name.1.jsonl" "${DEV[@]}" && cpu "$LOG/dummy-$name.cpu.jsonl" "${DEV[@]}" &&
     compare "dummy-$name-vs-cpu" "$LOG/dummy-$name.1.jsonl" "$LOG/dummy-$name.cpu.jsonl" &&
     run "$LOG/dummy-$name.2.jsonl" "${DEV[@]}" --tp=2 $SHARE &&
     compare "dummy-$name-tp2" "$LOG/dummy-$name.2.jsonl" "$LOG/dummy-$name.1.jsonl"; then
    pass "device-dummy-$name"
  else
    echo "FAIL device-dummy-$name"; tail -n 3 "$LOG"/dummy-"$name".*.err; failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
