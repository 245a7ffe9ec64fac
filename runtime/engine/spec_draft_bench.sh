#!/usr/bin/env bash
# Speculative decoding with a draft model on the CPU engine: tokens/s through //runtime:generate
# (dummy weights, llama-100m shape target, greedy, batch 1 and 8, 64-token random prompts, 64
# generated tokens per request), one line per run, interleaved over ROUNDS rounds:
#   plain          no speculation;
#   self K=2/4     the draft is the target itself (acceptance 100%: the mechanism's bound; each
#                  token still costs one draft step of the same size, so no gain is possible);
#   small K=4      a 2-layer draft of the target's width and vocabulary (random weights: acceptance
#                  ~0), with the adaptive draft length and with a fixed K.
#
#   runtime/engine/spec_draft_bench.sh [GENERATE_BIN] [THREADS] [ROUNDS]
set -euo pipefail
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
rounds=${3:-2}
small=$(mktemp --suffix=.json)
trap 'rm -f "$small"' EXIT
cat > "$small" << 'JSON'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
 "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 2,
 "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64, "rms_norm_eps": 1e-5,
 "max_position_embeddings": 4096, "tie_word_embeddings": true, "bos_token_id": 1,
 "eos_token_id": 2, "rope_theta": 10000.0, "hidden_act": "silu", "torch_dtype": "float32"}
JSON
for batch in 1 8; do
  p=$(python3 -c "import random; r = random.Random(7); \
print(';'.join(','.join(str(r.randrange(3, 32000)) for _ in range(64)) for _ in range($batch)))")
  for round in $(seq "$rounds"); do
    for mode in plain "self K=2" "self K=4" "small K=4" "small K=4 fixed"; do
      spec=()
      case $mode in
        self*) spec=(--speculative_method=draft --draft_model=dummy:llama-100m:0) ;;
        small*) spec=(--speculative_method=draft --draft_model="dummy:$small:1") ;;
      esac
      [[ $mode == *K=2* ]] && spec+=(--num_speculative_tokens=2)
      [[ $mode == *K=4* ]] && spec+=(--num_speculative_tokens=4)
      [[ $mode == *fixed ]] && spec+=(--speculative_adaptive=false)
      line=$("$gen" --load_format=dummy --dummy_config=llama-100m --prompt_ids="$p" \
        --max_tokens=64 --ignore_eos --num_threads="$threads" ${spec[@]+"${spec[@]}"} 2>&1 \
        > /dev/null | tail -1)
      echo "batch=$batch round=$round run=$mode $line"
    done
  done
done
