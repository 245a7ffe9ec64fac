#!/usr/bin/env bash
# Decode context parallelism on the CUDA backend with one GPU: `generate --backend=cuda --tp=N
# --dcp=K --tp_share_device` (N rank processes on the same GPU; each layer's shard attention +
# LSE, one all-to-all of the group and the LSE merge, the all-reduces and the logits gather
# staged through host memory over Gloo; CUDA graphs off, as for TP over Gloo) against `--tp=1`
# on the same GPU and against transformers, on the f32 fixtures with enough heads (computed in
# bf16). Criteria: the CUDA TP rule of tests/gpu/tp_cuda_golden.sh (tests/golden/README.md's
# bf16 tolerance): last-prompt logits cosine >= 0.999 to transformers and to TP=1; first greedy
# token equal to TP=1 wherever TP=1's top-2 gap is >= 3% of max|logit|; reported: greedy tokens
# equal to TP=1 prompt by prompt and the largest |logit - TP=1| over max|logit|.
# Cases: DCP 2 (TP_A 1), DCP 4, DCP 2 x TP_A 2 (zero all-to-all counts outside the slice), token
# interleave with 4-token blocks, a chunked prefill (8-token budget: q_len > 1 on the shards),
# and a context longer than one rank's pool (refused at TP=1, served at DCP=2).
# DeepSeek MLA (issue 33; runtime/cuda/cuda_mla_model.h): latent token shards, each rank's shard
# partial + LSE from kernels/mla, the same all-to-all and merge; on deepseek_v3_f32 (q_lora, YaRN,
# interleaved RoPE) and deepseek_v2_lite_f32 (no q_lora) against TP=1 and transformers: DCP 2,
# DCP 4, DCP 2 x TP_A 2, token interleave with 4-token pages, a chunked prefill; the
# DeepSeek-V3 latent width (tests/gpu/configs/deepseek-v3-latent, 512 + 64: the tensor-core
# kernels) on a 700-token prompt at DCP 2 and 4 against TP=1; an MLA context longer than one
# rank's latent pool (refused at TP=1, served at DCP=2).
#
#   tests/gpu/dcp_cuda_golden.sh BUNDLE_DIR LOG_DIR
#
# BUNDLE_DIR: tests/gpu/bundle.sh with tool//runtime:generate tool//runtime/model:make_dummy_model
# (the latent-512 case; skipped without it). Run from the repository root
# (reads tests/golden/fixtures). Prints "N passed, N failed, N skipped"; without a GPU it skips.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cuda_golden_lib.sh"
# SHARE="" (env): rank r on GPU r, collectives over NCCL; TP4_FLAGS: the 4-rank cases' flags
# (--tp_share_device on a machine with 2 or 3 GPUs).
TP4_FLAGS=${TP4_FLAGS-$SHARE}

check() {  # NAME OUT REF EXPECTED_JSON ARGS...: a DCP run compared with the TP=1 reference
  local name=$1 out=$2 ref=$3 exp=$4; shift 4
  if run "$out" "$@" && grep -q "DCP shard" "$out.err" &&
     compare "$name" "$out" "$ref" ${exp:+"$exp"}; then
    echo "PASS $name"; passed=$((passed + 1))
  else
    echo "FAIL $name ($*)"; tail -n 3 "$out.err"; failed=$((failed + 1))
  fi
}

if [[ -z ${MLA_ONLY:-} ]]; then  # the GQA fixtures
  for variant in llama_f32_gqa8x4 qwen2_f32; do
    fix=tests/golden/fixtures/$variant
    exp=$fix/expected.json
    prompts=$(prompts_of "$exp")
    P=(--model="$fix" --prompt_ids="$prompts")
    ref=$LOG/$variant.tp1.jsonl
    if ! run "$ref" "${P[@]}"; then
      echo "FAIL $variant tp=1 reference"; tail -n 3 "$ref.err"; failed=$((failed + 1)); continue
    fi
    check "$variant dcp2" "$LOG/$variant.d2.jsonl" "$ref" "$exp" "${P[@]}" --tp=2 --dcp=2 $SHARE
    check "$variant dcp2 interleave1 block4" "$LOG/$variant.d2i1.jsonl" "$ref" "$exp" "${P[@]}" \
      --tp=2 --dcp=2 --dcp_interleave=1 --block_size=4 $SHARE
    check "$variant dcp2 chunked" "$LOG/$variant.d2chunk.jsonl" "$ref" "$exp" "${P[@]}" \
      --tp=2 --dcp=2 --block_size=4 --max_num_batched_tokens=8 $SHARE
    check "$variant dcp2 tp4" "$LOG/$variant.d2a2.jsonl" "$ref" "$exp" "${P[@]}" \
      --tp=4 --dcp=2 $TP4_FLAGS
    if [[ $variant == llama_f32_gqa8x4 ]]; then
      check "$variant dcp4" "$LOG/$variant.d4.jsonl" "$ref" "$exp" "${P[@]}" --tp=4 --dcp=4 $TP4_FLAGS
    fi
  done

  # A context longer than one rank's pool: 4 blocks of 16 bf16 tokens per rank (2 layers x K/V x
  # 16 tokens x 4 KV heads x 16 dims x 2 bytes = 8192 bytes each), a 50-token prompt + 30 tokens =
  # 5 blocks. TP=1 refuses it naming the numbers; DCP=2 (3 blocks on shard 0, 2 on shard 1)
  # serves it, compared with a big-pool TP=1 run by the same rule. The prompt was picked for its
  # f32 greedy top-2 gaps (>= 3% of max|logit| for the first 15 steps on the CPU backend), so
  # bf16 rounding does not flip the first tokens and the reported equal prefix can reach the 5th
  # block (position 64: the 15th generated token).
  fix=tests/golden/fixtures/llama_f32_gqa8x4
  long=$(python3 -c "print(','.join(str((i * 101 + 11) % 500) for i in range(50)))")
  L=(--model="$fix" --prompt_ids="$long" --max_tokens=30)
  if run "$LOG/long.tp1.jsonl" "${L[@]}" &&
     ! run "$LOG/long.small.jsonl" "${L[@]}" --kv_cache_bytes=32768 &&
     grep -q "request needs 5 KV blocks but the whole pool has 4" "$LOG/long.small.jsonl.err"; then
    check "long context dcp2 (pool of 4 blocks per rank)" "$LOG/long.d2.jsonl" \
      "$LOG/long.tp1.jsonl" "" "${L[@]}" --tp=2 --dcp=2 --kv_cache_bytes=32768 $SHARE
  else
    echo "FAIL long context: tp=1 reference or its refusal"; tail -n 3 "$LOG"/long.*.err
    failed=$((failed + 1))
  fi
fi

# DeepSeek MLA: the latent's tokens sharded over the slice's ranks (MLA_ONLY=1 in the
# environment runs only this part).
for variant in deepseek_v3_f32 deepseek_v2_lite_f32; do
  fix=tests/golden/fixtures_mla/$variant
  exp=$fix/expected.json
  P=(--model="$fix" --prompt_ids="$(prompts_of "$exp")")
  ref=$LOG/$variant.tp1.jsonl
  if ! run "$ref" "${P[@]}"; then
    echo "FAIL $variant tp=1 reference"; tail -n 3 "$ref.err"; failed=$((failed + 1)); continue
  fi
  check "$variant dcp2" "$LOG/$variant.d2.jsonl" "$ref" "$exp" "${P[@]}" --tp=2 --dcp=2 $SHARE
  check "$variant dcp4" "$LOG/$variant.d4.jsonl" "$ref" "$exp" "${P[@]}" --tp=4 --dcp=4 $TP4_FLAGS
  [[ $variant == deepseek_v3_f32 ]] || continue
  check "$variant dcp2 tp4" "$LOG/$variant.d2a2.jsonl" "$ref" "$exp" "${P[@]}" \
    --tp=4 --dcp=2 $TP4_FLAGS
  check "$variant dcp2 interleave1 block4" "$LOG/$variant.d2i1.jsonl" "$ref" "$exp" "${P[@]}" \
    --tp=2 --dcp=2 --dcp_interleave=1 --block_size=4 $SHARE
  check "$variant dcp2 chunked" "$LOG/$variant.d2chunk.jsonl" "$ref" "$exp" "${P[@]}" \
    --tp=2 --dcp=2 --block_size=4 --max_num_batched_tokens=8 $SHARE
done
# DeepSeek-V3's latent width (the wgmma / mma.sync kernels, split-KV on the shards).
MK=$B/bin/runtime/model/make_dummy_model
if [[ -x $MK ]] && "$MK" --config=tests/gpu/configs/deepseek-v3-latent/config.json --seed=1 \
     --out="$LOG/latent" > "$LOG/make_dummy.out" 2>&1; then
  long=$(python3 -c "import random; random.seed(1); print(','.join(str(random.randrange(3, 2000)) for _ in range(700)))")
  LATENT=(--model="$LOG/latent" --prompt_ids="$long;5,6,7,8,9;100,200,300")
  if run "$LOG/latent.tp1.jsonl" "${LATENT[@]}"; then
    check "latent-512 dcp2" "$LOG/latent.d2.jsonl" "$LOG/latent.tp1.jsonl" "" "${LATENT[@]}" \
      --tp=2 --dcp=2 $SHARE
    check "latent-512 dcp4" "$LOG/latent.d4.jsonl" "$LOG/latent.tp1.jsonl" "" "${LATENT[@]}" \
      --tp=4 --dcp=4 $TP4_FLAGS
  else
    echo "FAIL latent-512 tp=1 reference"; tail -n 3 "$LOG/latent.tp1.jsonl.err"
    failed=$((failed + 1))
  fi
else
  echo "SKIP latent-512 (no make_dummy_model in the bundle)"; skipped=$((skipped + 1))
fi
# An MLA context longer than one rank's latent pool: 4 blocks of 16 bf16 latents per rank (2
# layers x 16 tokens x 40 values x 2 bytes = 2560 bytes each), a 50-token prompt + 30 tokens = 5
# blocks: TP=1 refuses it, DCP=2 (3 blocks on shard 0, 2 on shard 1) serves it.
fix=tests/golden/fixtures_mla/deepseek_v3_f32
long=$(python3 -c "print(','.join(str((i * 37 + 11) % 500) for i in range(50)))")
L=(--model="$fix" --prompt_ids="$long" --max_tokens=30)
if run "$LOG/mla_long.tp1.jsonl" "${L[@]}" &&
   ! run "$LOG/mla_long.small.jsonl" "${L[@]}" --kv_cache_bytes=10240 &&
   grep -q "request needs 5 KV blocks but the whole pool has 4" "$LOG/mla_long.small.jsonl.err"; then
  check "mla long context dcp2 (pool of 4 blocks per rank)" "$LOG/mla_long.d2.jsonl" \
    "$LOG/mla_long.tp1.jsonl" "" "${L[@]}" --tp=2 --dcp=2 --kv_cache_bytes=10240 $SHARE
else
  echo "FAIL mla long context: tp=1 reference or its refusal"; tail -n 3 "$LOG"/mla_long.*.err
  failed=$((failed + 1))
fi
echo "$passed passed, $failed failed, $skipped skipped"
[[ $failed == 0 ]]
