#!/usr/bin/env bash
# FP8 latent KV on the CUDA backend (--kv_cache_dtype=fp8; runtime/engine/kv_layout.h,
# Fp8LatentBlocks: each block its e4m3 codes then its fp32 row scales, one range; kernels/mla
# MlaWriteLatentFp8 and the FP8 read with DeviceKvCache::latent_block_bytes).
# Part "base": `generate --backend=cuda` (bf16 activations, FP8 latent pool, decode as CUDA
# graphs) on the dense MLA golden fixtures and the latent-512 random model (700-token prompt)
# against the CPU backend's FP8 run and transformers, by the CUDA golden rule loosened to the FP8
# tolerance of tests/golden/fp8_kv_golden_test.cc (cosine >= 0.995; first token equal where
# the top-2 gap is >= 30% of max|logit|); the bf16 pool of the same fixtures by the plain rule
# first (the kernels' sanity); eager equal to graphs with the FP8 pool. The MoE fixtures are left
# out: FP8 flips their closer routing decisions (fp8_kv_golden_test.cc, RoutingClearUnderFp8).
# Part "tp": the FP8 latent in tensor- and decode-context-parallel groups (each TP rank holds and
# quantizes the whole latent; DCP shards its tokens): --tp=2 and --tp=2 --dcp=2 (and --dcp=2
# with --dcp_interleave=1 --block_size=4) on deepseek_v3_f32, and the latent-512 model's
# 700-token prompt at --tp=2 --dcp=2, each against the CUDA TP=1 FP8 run of the same call (and
# transformers where the fixture has it), by the same FP8 rule. Part "dp": --tp=2
# --enable_expert_parallel --dp_attention on deepseek_v3_moe_f32 against its CUDA TP=1 FP8 run
# (fp8-tp2-ep-dp), and that group eager against its graphs.
#
#   [PARTS="base tp dp"] [SHARE=""] tests/gpu/mla_fp8_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# SHARE="" (env): TP rank r on GPU r over NCCL (default: --tp_share_device, one GPU, Gloo).
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

PARTS=${PARTS:-base tp dp}
long_prompt() {  # the latent-512 model's 700-token prompt
  python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 2000)) for _ in range(700)))"
}
fp8_tp() {  # NAME OUT REF EXPECTED_JSON|"" ARGS...: a CUDA FP8 group run against CUDA TP=1 FP8
  local name=$1 out=$2 ref=$3 exp=$4; shift 4
  # shellcheck disable=SC2086  # SHARE: zero or one flag
  if run "$out" --kv_cache_dtype=fp8 "$@" $SHARE &&
     { [[ " $* " != *" --dcp="* ]] || grep -q "DCP shard" "$out.err"; } &&
     COMPARE_MIN_COSINE=0.995 COMPARE_FIRST_TOKEN_GAP=0.3 \
       compare "$name" "$out" "$ref" ${exp:+"$exp"}; then
    pass "$name"
  else
    fail "$name" "$out.err"
  fi
}

if [[ " $PARTS " == *" base "* ]]; then
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
  fp8 latent-512-fp8 "$LOG/latent" "" --model="$LOG/latent" \
    --prompt_ids="$(long_prompt);5,6,7,8,9;100,200,300"
fi
if [[ " $PARTS " == *" tp "* ]]; then
  fix=tests/golden/fixtures_mla/deepseek_v3_f32
  exp=$fix/expected.json
  P=(--model="$fix" --prompt_ids="$(prompts_of "$exp")")
  ref=$LOG/tp.deepseek_v3_f32.tp1_fp8.jsonl
  if run "$ref" --kv_cache_dtype=fp8 "${P[@]}"; then
    fp8_tp fp8-tp2 "$LOG/tp.v3.tp2_fp8.jsonl" "$ref" "$exp" "${P[@]}" --tp=2
    fp8_tp fp8-tp2-dcp2 "$LOG/tp.v3.d2_fp8.jsonl" "$ref" "$exp" "${P[@]}" --tp=2 --dcp=2
    fp8_tp fp8-tp2-dcp2-interleave1-block4 "$LOG/tp.v3.d2i1_fp8.jsonl" "$ref" "$exp" "${P[@]}" \
      --tp=2 --dcp=2 --dcp_interleave=1 --block_size=4
  else
    fail "fp8-tp1-reference" "$ref.err"
  fi
  "$B/bin/runtime/model/make_dummy_model" --config=tests/gpu/configs/deepseek-v3-latent/config.json \
    --seed=1 --out="$LOG/tp_latent" > "$LOG/tp_make_dummy.out" 2>&1
  L=(--model="$LOG/tp_latent" --prompt_ids="$(long_prompt);5,6,7,8,9;100,200,300")
  if run "$LOG/tp.latent.tp1_fp8.jsonl" --kv_cache_dtype=fp8 "${L[@]}"; then
    fp8_tp latent-512-fp8-tp2-dcp2 "$LOG/tp.latent.d2_fp8.jsonl" "$LOG/tp.latent.tp1_fp8.jsonl" \
      "" "${L[@]}" --tp=2 --dcp=2
  else
    fail "latent-512-fp8-tp1-reference" "$LOG/tp.latent.tp1_fp8.jsonl.err"
  fi
fi
if [[ " $PARTS " == *" dp "* ]]; then
  # Data-parallel attention + EP (b) over the FP8 latent (each DP rank its requests' latent
  # codes and row scales in its own pool, decode padded alike on both ranks and replayed as
  # graphs), against the CUDA TP=1 FP8 run of the MoE fixture (not transformers: FP8 flips its
  # closer routing decisions, see above); then the same padded steps eager.
  moe=tests/golden/fixtures_mla/deepseek_v3_moe_f32
  M=(--model="$moe" --prompt_ids="$(prompts_of "$moe/expected.json")")
  if run "$LOG/tp.v3moe.tp1_fp8.jsonl" --kv_cache_dtype=fp8 "${M[@]}"; then
    fp8_tp fp8-tp2-ep-dp "$LOG/tp.v3moe.dp_fp8.jsonl" "$LOG/tp.v3moe.tp1_fp8.jsonl" "" "${M[@]}" \
      --tp=2 --enable_expert_parallel --dp_attention
    # shellcheck disable=SC2086  # SHARE: zero or one flag
    tokens_check fp8-tp2-ep-dp-eager "fp8 dp eager vs graphs" "$LOG/tp.v3moe.dp_eager.jsonl" \
      "$LOG/tp.v3moe.dp_fp8.jsonl" --kv_cache_dtype=fp8 "${M[@]}" --tp=2 --enable_expert_parallel \
      --dp_attention --cuda_graphs=false $SHARE
  else
    fail "fp8-moe-tp1-reference" "$LOG/tp.v3moe.tp1_fp8.jsonl.err"
  fi
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
