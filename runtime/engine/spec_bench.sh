#!/usr/bin/env bash
# Speculative decoding on the CPU engine: tokens/s with and without n-gram drafts through
# //runtime:generate (dummy weights, llama-100m shape), one line per run, on three workloads:
#   repeat  prompts repeating an 8-token pattern, greedy (the random-weight model's greedy
#           output falls into a loop the drafter predicts: high acceptance);
#   random  random prompts, greedy (the output loops too: drafts come from the output);
#   reject  a 64-token vocabulary, temperature 1: drafts proposed at almost every step and
#           almost all rejected (the cost of verifying K drafts for nothing).
#
#   runtime/engine/spec_bench.sh [GENERATE_BIN] [THREADS] [EXTRA_FLAGS...]
# EXTRA_FLAGS go to the speculative runs, e.g. --speculative_adaptive=false (a fixed K).
set -euo pipefail
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
shift $(($# < 2 ? $# : 2))
extra=("$@")
v64=$(mktemp --suffix=.json)
trap 'rm -f "$v64"' EXIT
cat > "$v64" << 'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
 "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
 "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
 "max_position_embeddings": 4096, "tie_word_embeddings": true, "bos_token_id": 1,
 "eos_token_id": 2, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "float32"}
JSON
prompts() { # prompts KIND BATCH VOCAB: BATCH prompts of 64 tokens, ';'-separated
  python3 - "$1" "$2" "$3" << 'PY'
import random, sys
kind, batch, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
out = []
for _ in range(batch):
    if kind == "repeat":
        pattern = [rng.randrange(3, vocab) for _ in range(8)]
        out.append([pattern[i % 8] for i in range(64)])
    else:
        out.append([rng.randrange(3, vocab) for _ in range(64)])
print(";".join(",".join(map(str, p)) for p in out))
PY
}
for kind in repeat random reject; do
  model=(--dummy_config=llama-100m) vocab=32000 sampling=()
  if [[ $kind == reject ]]; then
    model=(--dummy_config="$v64") vocab=64 sampling=(--temperature=1)
  fi
  for batch in 1 8; do
    p=$(prompts "$kind" "$batch" "$vocab")
    for k in 0 2 4; do
      spec=()
      [[ $k == 0 ]] || spec=(--speculative_method=ngram --num_speculative_tokens="$k" ${extra[@]+"${extra[@]}"})
      line=$("$gen" --load_format=dummy "${model[@]}" --prompt_ids="$p" --max_tokens=64 \
        --ignore_eos --num_threads="$threads" ${sampling[@]+"${sampling[@]}"} \
        ${spec[@]+"${spec[@]}"} 2>&1 > /dev/null | tail -1)
      echo "workload=$kind batch=$batch K=$k $line"
    done
  done
done
