#!/usr/bin/env bash
# The README's main-job command: from a fresh Debian 12 machine to a generation on the CPU.
#
#   deploy/quickstart.sh [BAZEL_FLAGS...]
#
# Installs the dependencies, builds every target (CUDA objects too where a toolkit is
# installed), writes a small random-weight Llama model in Hugging Face format (no download),
# and generates from two prompts in one continuous batch with the single-worker engine.
# The serving issue extends this to router + prefill + decode workers streaming a request.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
deploy/install_deps.sh
bazel build --noshow_progress -c opt "$@" //...
BIN=$(bazel info -c opt "$@" bazel-bin 2>/dev/null)
MODEL=${TANDEM_DEMO_MODEL:-$ROOT/out/demo-llama-100m}
if [[ ! -f $MODEL/config.json ]]; then
  echo "quickstart: writing a ~100M-parameter random-weight Llama to $MODEL"
  "$BIN/runtime/model/make_dummy_model" --config=llama-100m --out="$MODEL" --seed=1
fi
echo "quickstart: generating (CPU backend, 2 prompts in one batch, greedy, 16 tokens each)"
"$BIN/runtime/generate" --model="$MODEL" --prompt_ids="1,450,4996,17354;1,319,11148" \
  --max_tokens=16 --backend=cpu
echo "quickstart: done. Try: $BIN/runtime/generate --help"
