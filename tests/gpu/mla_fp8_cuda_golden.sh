#!/usr/bin/env bash
# FP8 latent KV on the CUDA backend (--kv_cache_dtype=fp8; runtime/engine/kv_layout.h,
# Fp8LatentPool; kernels/mla MlaWriteLatentFp8 and the FP8 read): `generate --backend=cuda`
# (bf16 activations, FP8 latent pool, decode as CUDA graphs) on the dense MLA golden fixtures and
# the latent-512 random model (700-token prompt) against the CPU backend's FP8 run and
# transformers, by the CUDA golden rule loosened to the FP8 tolerance of
# tests/golden/mla_fp8_kv_golden_test.cc (cosine >= 0.995; first token equal where the top-2 gap
# is >= 30% of max|logit|); the bf16 pool of the same fixtures by the plain rule first (the
# kernels' sanity); eager equal to graphs with the FP8 pool. The MoE fixtures are left out: FP8
# flips their closer routing decisions (mla_fp8_kv_golden_test.cc, RoutingClearUnderFp8).
#
#   tests/gpu/mla_fp8_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate tool//runtime/model:make_dummy_model.
# Run from the repository root. Prints "N passed, N failed, N skipped".
set -uo pipefail
# shellcheck source-path=SCRIPTDIR source=cuda_golden_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"

cpu() {  # OUT ARGS...: the same generate on the CPU backend
  local out=$1; shift
  timeout 300 "$G" --backend=cpu --max_tokens=16 --ignore_eos --dump_last_logits \
    --num_threads=8 "$@" > "$out" 2> "$out.err"
}
fp8() {  # NAME OUT_PREFIX EXPECTED_JSON|"" ARGS...: CUDA FP8 against CPU FP8 (and transformers)
  local name=$1 o=$2 exp=$3; shift 3
  if run "$o.cuda_fp8.jsonl" --kv_cache_dtype=fp8 "$@" &&
     cpu "$o.cpu_fp8.jsonl" --kv_cache_dtype=fp8 "$@" &&
     COMPARE_MIN_COSINE=0.995 COMPARE_FIRST_TOKEN_GAP=0.3 \
       compare "$name" "$o.cuda_fp8.jsonl" "$o.cpu_fp8.jsonl" ${exp:+"$exp"}; then
    pass "$name"
  else
    fail "$name" "$o.cuda_fp8.jsonl.err" "$o.cpu_fp8.jsonl.err"
  fi
}

for variant in deepseek_v2_f32 deepseek_v2_lite_f32 deepseek_v3_f32; do
  fix=tests/golden/fixtures_mla/$variant
  prompts=$(prompts_of "$fix/expected.json")
  if run "$LOG/$variant.bf16.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     cpu "$LOG/$variant.cpu.jsonl" --model="$fix" --prompt_ids="$prompts" &&
     compare "$variant-bf16" "$LOG/$variant.bf16.jsonl" "$LOG/$variant.cpu.jsonl" \
       "$fix/expected.json"; then
    pass "$variant-bf16"
  else
    fail "$variant-bf16" "$LOG/$variant.bf16.jsonl.err"
  fi
  fp8 "$variant-fp8" "$LOG/$variant" "$fix/expected.json" --model="$fix" --prompt_ids="$prompts"
done
fix=tests/golden/fixtures_mla/deepseek_v3_f32
tokens_check fp8-eager-vs-graphs "fp8 eager vs graphs" "$LOG/fp8_eager.jsonl" \
  "$LOG/deepseek_v3_f32.cuda_fp8.jsonl" --model="$fix" --prompt_ids="$(prompts_of "$fix/expected.json")" \
  --kv_cache_dtype=fp8 --cuda_graphs=false
"$B/bin/runtime/model/make_dummy_model" --config=tests/gpu/configs/deepseek-v3-latent/config.json \
  --seed=1 --out="$LOG/latent" > "$LOG/make_dummy.out" 2>&1
long=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 2000)) for _ in range(700)))")
fp8 latent-512-fp8 "$LOG/latent" "" --model="$LOG/latent" --prompt_ids="$long;5,6,7,8,9;100,200,300"
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
