# shellcheck shell=bash
# Shared by the speculative decoding benchmarks (runtime/engine/spec_*bench.sh on the CPU,
# tests/gpu/spec_*bench.sh on a GPU); sourced, not run.
#
# llama_config FILE [KEY=VALUE...]: writes a Llama config.json for generate's dummy weights
#   (--dummy_config=FILE, --draft_model=dummy:FILE:SEED): the llama-100m shape (hidden 768, 12
#   layers, 32000-token vocabulary, f32, tied embeddings) with each KEY set to VALUE (JSON: a
#   number as is, a string in double quotes).
# prompts KIND BATCH VOCAB: BATCH prompts of 64 tokens in [3, VOCAB), ';'-separated, from a
#   fixed seed; KIND repeat repeats an 8-token pattern, any other KIND is random tokens.
# llama8b_v64_config FILE: the Llama-3-8B shape (bf16) with a 64-token vocabulary (random weights
#   fall into greedy loops the n-gram drafter sometimes predicts).
# llama1b_config FILE: the Llama-3.2-1B shape (bf16, the 128256-token vocabulary): a draft model.
# deepseek_mtp_config FILE: a small DeepSeek-V3 (V2-Lite's attention: 16 heads, latent 512 + 64,
#   hidden 2048; 2 dense layers, 32000 ids) with one MTP layer (num_nextn_predict_layers 1).
# gpu_generate BUNDLE: sets gen to the bundle's generate and LD_LIBRARY_PATH to its libraries
#   and CUDA's (tests/gpu/bundle.sh BUNDLE tool//runtime:generate).

llama_config() {
  python3 - "$@" << 'PY'
import json, sys
config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
          "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
          "num_attention_heads": 12, "num_key_value_heads": 4, "head_dim": 64,
          "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "tie_word_embeddings": True,
          "bos_token_id": 1, "eos_token_id": 2, "rope_theta": 10000.0, "hidden_act": "silu",
          "torch_dtype": "float32"}
for setting in sys.argv[2:]:
    key, value = setting.split("=", 1)
    config[key] = json.loads(value)
with open(sys.argv[1], "w") as f:
    json.dump(config, f)
PY
}

llama8b_v64_config() {
  llama_config "$1" vocab_size=64 hidden_size=4096 intermediate_size=14336 num_hidden_layers=32 \
    num_attention_heads=32 num_key_value_heads=8 head_dim=128 max_position_embeddings=8192 \
    rope_theta=500000.0 tie_word_embeddings=false 'torch_dtype="bfloat16"'
}

llama1b_config() {
  llama_config "$1" vocab_size=128256 hidden_size=2048 intermediate_size=8192 \
    num_hidden_layers=16 num_attention_heads=32 num_key_value_heads=8 \
    max_position_embeddings=131072 rope_theta=500000.0 'torch_dtype="bfloat16"'
}

deepseek_mtp_config() {
  python3 - "$1" << 'PY'
import json, sys
c = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
     "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 10944,
     "num_hidden_layers": 2, "first_k_dense_replace": 2, "num_attention_heads": 16,
     "num_key_value_heads": 16, "q_lora_rank": None, "kv_lora_rank": 512,
     "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
     "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000,
     "bos_token_id": 0, "eos_token_id": 1, "num_nextn_predict_layers": 1,
     "torch_dtype": "bfloat16"}
json.dump(c, open(sys.argv[1], "w"))
PY
}

prompts() {
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

gpu_generate() {
  # shellcheck disable=SC2034  # gen is the sourcing script's
  gen="$1/bin/runtime/generate"
  export LD_LIBRARY_PATH="$1/lib:${CUDA_HOME:-/usr/local/cuda}/lib64:${LD_LIBRARY_PATH:-}"
}
