#!/usr/bin/env bash
# Tensor and decode context parallelism for DeepSeek MLA against transformers: `generate --tp=N` (N rank processes
# over Gloo on loopback, each loading only its heads, MLP slice and vocabulary rows; the latent
# whole on every rank) on MLA fixtures, all prompts as one batch: greedy tokens identical and
# last-prompt logits within 1e-4 * max to transformers (compare_generate.py). TP 4 is one head
# per rank; the MoE fixtures split every expert's intermediate rows. Then decode context
# parallelism (latent shards by tokens) against transformers, and a context longer than one
# rank's latent pool served by DCP=2 (refused at DCP=1). And the MTP fixture speculating with its
# own MTP layer at TP=2.
set -euo pipefail
GENERATE=$1
COMPARE=$2
T=${TEST_TMPDIR:-$(mktemp -d)}
FIXTURES=tests/golden/fixtures_mla

run() { # VARIANT OUT ARGS...
  local fix=$FIXTURES/$1 out=$2
  shift 2
  local prompts
  prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$fix/expected.json'))['prompts']))")
  timeout 120 "$GENERATE" --model="$fix" --prompt_ids="$prompts" --max_tokens=16 --ignore_eos \
    --dump_last_logits --num_threads=1 "$@" >"$out" 2>"$out.err" ||
    {
      echo "FAIL: $fix $*"
      cat "$out.err"
      exit 1
    }
}

for case in deepseek_v2_f32:2 deepseek_v3_f32:4 deepseek_v2_lite_f32:2 deepseek_v3_moe_f32:2; do
  variant=${case%:*}
  tp=${case#*:}
  echo "$variant tp=$tp"
  run "$variant" "$T/$variant.$tp.jsonl" --tp="$tp"
  python3 "$COMPARE" "$T/$variant.$tp.jsonl" "$FIXTURES/$variant/expected.json"
done

# DeepSeek-V3's MTP layer drafting (--speculative_method=mtp) in a TP=2 group: rank 0 runs the MTP
# layer whole on the target's hidden states, the group verifies; tokens and logits stay
# transformers' (the MTP fixture's target is deepseek_v3_moe_f32).
echo "deepseek_v3_mtp_f32 tp=2 mtp"
mtp_ref=$FIXTURES/deepseek_v3_moe_f32/expected.json
mtp_prompts=$(python3 -c "import json; print(';'.join(','.join(map(str, p)) for p in json.load(open('$mtp_ref'))['prompts']))")
timeout 120 "$GENERATE" --model=tests/golden/fixtures_mtp/deepseek_v3_mtp_f32 \
  --prompt_ids="$mtp_prompts" --max_tokens=16 --ignore_eos --dump_last_logits --num_threads=1 \
  --tp=2 --speculative_method=mtp --num_speculative_tokens=3 >"$T/mtp.jsonl" 2>"$T/mtp.err" ||
  {
    echo "FAIL: MTP at tp=2"
    cat "$T/mtp.err"
    exit 1
  }
grep -q "drafted [1-9]" "$T/mtp.err" || {
  echo "FAIL: the MTP layer drafted nothing"
  cat "$T/mtp.err"
  exit 1
}
python3 "$COMPARE" "$T/mtp.jsonl" "$mtp_ref"

# Decode context parallelism: the slice's ranks hold token shards of the latent, exchange
# (out, lse) once per layer, merge by LSE (TP_A 1 and 2; interleave 1 token and a block).
for case in "deepseek_v3_f32:--tp=2 --dcp=2 --dcp_interleave=1" \
  "deepseek_v2_moe_f32:--tp=4 --dcp=2"; do
  variant=${case%%:*}
  args=${case#*:}
  echo "$variant $args"
  # shellcheck disable=SC2086
  run "$variant" "$T/$variant.dcp.jsonl" $args
  grep -q "dcp=" "$T/$variant.dcp.jsonl.err" || {
    echo "FAIL: no DCP group started"
    exit 1
  }
  python3 "$COMPARE" "$T/$variant.dcp.jsonl" "$FIXTURES/$variant/expected.json"
done

# A context longer than one rank's pool: 4 latent blocks of 16 tokens per rank (2 layers x 16 x
# 40 floats = 5120 bytes each), a 50-token prompt + 30 tokens = 5 blocks. DCP=1 refuses it;
# DCP=2 (3 blocks on shard 0, 2 on shard 1) serves it as a big-pool DCP=1 run does.
long=$(python3 -c "print(','.join(str((i * 37 + 11) % 500) for i in range(50)))")
gen_long() { # OUT ARGS...
  local out=$1
  shift
  timeout 120 "$GENERATE" --model="$FIXTURES/deepseek_v3_f32" --prompt_ids="$long" \
    --max_tokens=30 --ignore_eos --dump_last_logits --num_threads=1 "$@" >"$out" 2>"$out.err"
}
gen_long "$T/long.ref.jsonl" --tp=1 || {
  cat "$T/long.ref.jsonl.err"
  exit 1
}
if gen_long "$T/long.small.jsonl" --tp=1 --kv_cache_bytes=20480; then
  echo "FAIL: 80 tokens fit a 64-token latent pool at dcp=1"
  exit 1
fi
grep -q "request needs 5 KV blocks but the whole pool has 4" "$T/long.small.jsonl.err" || {
  echo "FAIL: dcp=1 refusal said:"
  cat "$T/long.small.jsonl.err"
  exit 1
}
gen_long "$T/long.dcp2.jsonl" --tp=2 --dcp=2 --kv_cache_bytes=20480 || {
  echo "FAIL: dcp=2 with 4 latent blocks per rank"
  cat "$T/long.dcp2.jsonl.err"
  exit 1
}
python3 "$COMPARE" --run "$T/long.dcp2.jsonl" "$T/long.ref.jsonl" dcp=1
echo "ok: dcp=2 serves 80 tokens over two 64-token latent pools"
