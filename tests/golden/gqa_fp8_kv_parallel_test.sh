#!/usr/bin/env bash
# FP8 K / V (--kv_cache_dtype=fp8: e4m3 codes, one scale per layer's K or V) of a GQA model in
# tensor- and decode-context-parallel groups on the CPU backend: `generate --tp=N [--dcp=K]` (rank
# processes over Gloo on loopback) on llama_f32_gqa8x4 (8 q / 4 kv heads) against its TP=1 FP8 run,
# all prompts as one batch. TP splits the kv heads (each rank quantizes its heads' values with the
# same per-tensor scale), DCP shards the tokens. Greedy tokens must be identical and last-prompt
# logits within 1e-3 * max|logit|: a code is a step function of its value, and the group's f32 sums
# move some values across a rounding boundary (measured: TP=2 5.6e-4, TP=2 x DCP=2 1.0e-6, TP=4 x
# DCP=2 2.6e-6). The runs really are FP8: apart from the f32 pool's by more than that (9.6e-2).
# Then a context longer than one rank's FP8 pool served by DCP=2 as by a big-pool TP=1 run.
# The MLA latent twin: mla_fp8_kv_parallel_test.sh. (~5 s)
set -euo pipefail
GENERATE=$1
T=${TEST_TMPDIR:-$(mktemp -d)}
FIX=tests/golden/fixtures/llama_f32_gqa8x4
# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"

run_generate 16 "$FIX" 1 "$T/tp1.jsonl" --kv_cache_dtype=fp8
run_generate 16 "$FIX" 1 "$T/f32.jsonl"
within "$T/f32.jsonl" "$T/tp1.jsonl" "f32 vs fp8 K / V at tp=1" differ
for tp_args in "2|" "2|--dcp=2 --dcp_interleave=1" "4|--dcp=2"; do
  tp=${tp_args%%|*}
  extra=${tp_args#*|}
  # shellcheck disable=SC2086
  run_generate 16 "$FIX" "$tp" "$T/par.jsonl" --kv_cache_dtype=fp8 $extra
  if [[ -n $extra ]]; then
    grep -q "dcp=2" "$T/par.jsonl.err" || { echo "FAIL: no DCP group started"; exit 1; }
  fi
  within "$T/par.jsonl" "$T/tp1.jsonl" "fp8 tp=$tp $extra vs fp8 tp=1"
done

# 4 FP8 blocks of 16 tokens per rank (2 layers x 16 x 2 x 4 kv heads x 16 = 4096 bytes each; at
# DCP each rank holds all 4 kv heads): a 50-token prompt + 30 tokens = 5 blocks. TP=1 refuses
# it; DCP=2 (3 blocks on shard 0, 2 on shard 1) serves it as a big-pool TP=1 FP8 run does.
long=$(python3 -c "print(','.join(str((i * 37 + 11) % 500) for i in range(50)))")
common=(--model="$FIX" --prompt_ids="$long" --max_tokens=30 --ignore_eos --dump_last_logits
  --num_threads=1 --kv_cache_dtype=fp8)
timeout 120 "$GENERATE" "${common[@]}" > "$T/long.ref.jsonl" 2> "$T/long.ref.err" ||
  { echo "FAIL: long tp=1"; cat "$T/long.ref.err"; exit 1; }
T=$T expect_fail "80 tokens in a 64-token FP8 K / V pool at dcp=1" \
  "request needs 5 KV blocks but the whole pool has 4" "${common[@]}" --kv_cache_bytes=16384
timeout 120 "$GENERATE" "${common[@]}" --tp=2 --dcp=2 --kv_cache_bytes=16384 > "$T/long.dcp2.jsonl" \
  2> "$T/long.dcp2.err" || { echo "FAIL: long dcp=2"; cat "$T/long.dcp2.err"; exit 1; }
within "$T/long.dcp2.jsonl" "$T/long.ref.jsonl" "fp8 dcp=2 over two 4-block pools vs fp8 tp=1"
echo "ok"
