#!/usr/bin/env bash
# Tokenizer throughput, ours vs Hugging Face `tokenizers`, on the same file and tokenizer.
#   tokenizer/compare_bench.sh TOKENIZER_JSON TEXT_FILE     (needs `pip install tokenizers`)
set -euo pipefail
cd "$(dirname "$0")/.."
bazel build -c opt --noshow_progress //tokenizer:tokenizer_bench 2>/dev/null
bazel-bin/tokenizer/tokenizer_bench --tokenizer="$1" --text="$2"
python3 tokenizer/bench_hf.py --tokenizer="$1" --text="$2"
