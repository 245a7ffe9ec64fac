#!/usr/bin/env bash
# FP8 latent KV (--kv_cache_dtype=fp8) in tensor- and decode-context-parallel groups on the CPU
# backend: `generate --tp=N [--dcp=K]` (rank processes over Gloo on loopback) against the same
# fixture at TP=1 with FP8 latents, all prompts as one batch. Every TP rank holds the whole latent
# and quantizes the same rows; DCP shards the rows by tokens. Greedy tokens must be identical and
# last-prompt logits within 1e-3 * max|logit|: wider than the f32 rule (1e-4) because a row's
# e4m3 codes are a step function of the latent, and the group's f32 sums (o_proj / MLP
# all-reduce, 5e-7 of max apart from TP=1) can move one value across a rounding boundary (measured:
# 1.4e-4 on one prompt of ten, the same at TP 2, TP 2 x DCP 2 and TP 4 x DCP 2). And the runs
# really are FP8: they differ from the f32 latent run by more than that. Then a context longer
# than one rank's FP8 latent pool served by DCP=2 as by a big-pool TP=1 FP8 run. Last, data-
# parallel attention (--tp=2 --enable_expert_parallel --dp_attention) over FP8 latents on the
# DeepSeek-V3 MoE fixture against its TP=1 FP8 run, and two contexts of 5 FP8 blocks each served
# from two DP ranks' 5-block pools.
set -euo pipefail
GENERATE=$1
FIX=tests/golden/fixtures_mla/deepseek_v3_f32
MOE=tests/golden/fixtures_mla/deepseek_v3_moe_f32
T=${TEST_TMPDIR:-$(mktemp -d)}
model=$FIX # the fixture `run` serves

run() { # OUT PROMPTS MAX_TOKENS ARGS...
  local out=$1 prompts=$2 max=$3
  shift 3
  timeout 120 "$GENERATE" --model="$model" --prompt_ids="$prompts" --max_tokens="$max" \
    --ignore_eos --dump_last_logits --num_threads=1 "$@" >"$out" 2>"$out.err" ||
    {
      echo "FAIL: $*"
      cat "$out.err"
      exit 1
    }
}

# shellcheck source-path=SCRIPTDIR source=generate_tp_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/generate_tp_lib.sh"
compare() { within "$@"; }  # tokens equal, logits within 1e-3 of max (or `differ`)

prompts_of() { # FIXTURE: its expected.json prompts as --prompt_ids
  python3 -c "import json, sys; print(';'.join(','.join(map(str, p)) for p in json.load(open(sys.argv[1]))['prompts']))" "$1/expected.json"
}

prompts=$(prompts_of "$FIX")
run "$T/tp1.jsonl" "$prompts" 16 --kv_cache_dtype=fp8
run "$T/f32.jsonl" "$prompts" 16
compare "$T/tp1.jsonl" "$T/f32.jsonl" "fp8 vs f32 latent at tp=1" differ
for args in "--tp=2" "--tp=2 --dcp=2 --dcp_interleave=1" "--tp=4 --dcp=2"; do
  echo "fp8 $args"
  # shellcheck disable=SC2086
  run "$T/par.jsonl" "$prompts" 16 --kv_cache_dtype=fp8 $args
  if [[ $args == *dcp* ]]; then
    grep -q "dcp=" "$T/par.jsonl.err" || {
      echo "FAIL: no DCP group started"
      exit 1
    }
  fi
  compare "$T/par.jsonl" "$T/tp1.jsonl" "fp8 $args vs fp8 tp=1"
done

# 4 FP8 latent blocks of 16 tokens per rank (2 layers x 16 x (40 codes + 4 scale bytes) = 1408
# bytes each): a 50-token prompt + 30 tokens = 5 blocks. TP=1 refuses it; DCP=2 (3 blocks on
# shard 0, 2 on shard 1) serves it as a big-pool TP=1 FP8 run does.
long=$(python3 -c "print(','.join(str((i * 37 + 11) % 500) for i in range(50)))")
run "$T/long.ref.jsonl" "$long" 30 --kv_cache_dtype=fp8
if "$GENERATE" --model="$FIX" --prompt_ids="$long" --max_tokens=30 --ignore_eos --num_threads=1 \
  --kv_cache_dtype=fp8 --kv_cache_bytes=5632 >/dev/null 2>"$T/small.err"; then
  echo "FAIL: 80 tokens fit a 64-token FP8 latent pool at dcp=1"
  exit 1
fi
grep -q "request needs 5 KV blocks but the whole pool has 4" "$T/small.err" || {
  echo "FAIL: dcp=1 refusal said:"
  cat "$T/small.err"
  exit 1
}
run "$T/long.dcp2.jsonl" "$long" 30 --kv_cache_dtype=fp8 --tp=2 --dcp=2 --kv_cache_bytes=5632
compare "$T/long.dcp2.jsonl" "$T/long.ref.jsonl" "fp8 dcp=2 over two 4-block pools vs fp8 tp=1"

# Data-parallel attention: each DP rank quantizes its own requests' latent rows into its own pool
# of FP8 blocks (codes and row scales in the block), the MoE layers' rows exchanged by all-to-all.
# Measured: logits bit-equal to TP=1 FP8. The runs are FP8: apart from transformers' f32 logits.
model=$MOE
DP=(--tp=2 --enable_expert_parallel --dp_attention --kv_cache_dtype=fp8)
prompts=$(prompts_of "$MOE")
python3 - "$MOE/expected.json" >"$T/moe.f32.jsonl" <<'EOF'
import json, sys
e = json.load(open(sys.argv[1]))
for tokens, logits in zip(e["greedy_tokens"], e["last_prompt_logits"]):
    print(json.dumps({"tokens": tokens, "last_prompt_logits": logits}))
EOF
run "$T/moe.tp1.jsonl" "$prompts" 16 --kv_cache_dtype=fp8
run "$T/moe.dp2.jsonl" "$prompts" 16 "${DP[@]}"
grep -q "data-parallel attention over 2 ranks" "$T/moe.dp2.jsonl.err" || {
  echo "FAIL: no DP attention group started"
  exit 1
}
compare "$T/moe.dp2.jsonl" "$T/moe.f32.jsonl" "fp8 dp=2 vs transformers f32" differ
compare "$T/moe.dp2.jsonl" "$T/moe.tp1.jsonl" "fp8 dp=2 vs fp8 tp=1"
# Two 50-token prompts + 30 tokens, 5 blocks each (1408 bytes: as above), 5 blocks per DP rank
# (--kv_cache_bytes is each rank's): one request on each rank (dp_rank.h). A pool sized in f32
# latent blocks (5120 bytes) would hold one block and refuse them.
two="$long;$(python3 -c "print(','.join(str((i * 53 + 7) % 500) for i in range(50)))")"
run "$T/two.ref.jsonl" "$two" 30 --kv_cache_dtype=fp8
run "$T/two.dp2.jsonl" "$two" 30 "${DP[@]}" --kv_cache_bytes=7040
compare "$T/two.dp2.jsonl" "$T/two.ref.jsonl" "fp8 dp=2 over two 5-block pools vs fp8 tp=1"
echo "ok"
