#!/usr/bin/env bash
# The cost of rejected drafts on the CPU engine: plain, fixed K = 3 and adaptive K = 3 n-gram
# speculation, interleaved over ROUNDS rounds, on the reject workload of spec_bench.sh (a
# 64-token vocabulary of the llama-100m shape at temperature 1: drafts at almost every step,
# almost all rejected), 64-token prompts, 128 tokens per request, batch 1 and 8. Each line gives
# the step loop's wall time (generate's stderr) and the process's CPU time (user + system, from
# /usr/bin/time: steadier than wall time on a shared machine; mode "load" is the same process with
# max_tokens = 1, the part of the CPU time that is not decoding).
#
#   runtime/engine/spec_reject_bench.sh [GENERATE_BIN] [THREADS] [ROUNDS]
set -euo pipefail
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
rounds=${3:-5}
v64=$(mktemp --suffix=.json)
trap 'rm -f "$v64" "$v64.time"' EXIT
cat > "$v64" << 'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64,
 "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
 "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
 "max_position_embeddings": 4096, "tie_word_embeddings": true, "bos_token_id": 1,
 "eos_token_id": 2, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "float32"}
JSON
for batch in 1 8; do
  p=$(python3 -c "import random; r = random.Random(7); \
print(';'.join(','.join(str(r.randrange(3, 64)) for _ in range(64)) for _ in range($batch)))")
  for round in $(seq "$rounds"); do
    for mode in load plain fixed adaptive; do
      spec=() max_tokens=128
      [[ $mode == load ]] && max_tokens=1
      [[ $mode == fixed || $mode == adaptive ]] &&
        spec=(--speculative_method=ngram --num_speculative_tokens=3)
      [[ $mode == fixed ]] && spec+=(--speculative_adaptive=false)
      line=$(/usr/bin/time -o "$v64.time" -f "cpu %U+%S s" "$gen" --load_format=dummy \
        --dummy_config="$v64" --prompt_ids="$p" --max_tokens="$max_tokens" --ignore_eos \
        --num_threads="$threads" --temperature=1 ${spec[@]+"${spec[@]}"} 2>&1 > /dev/null |
        tail -1)
      line="$line; $(cat "$v64.time")"
      echo "batch=$batch round=$round mode=$mode $line"
    done
  done
done
