#!/usr/bin/env bash
# Speculative decoding with a draft model on one GPU through //runtime:generate, dummy bf16
# weights of the Llama-3-8B shape as the target, batch 1, greedy, 64-token prompt:
#   plain            no speculation (run first and last: drift between them);
#   self K=2/4       the draft is the target itself (same config and seed): acceptance near 100%,
#                    the mechanism's upper bound (each token still costs one 8B draft step);
#   1b K=4           a Llama-3.2-1B-shape random draft: acceptance ~0 (random weights), so the
#                    adaptive draft length backs off (the rejection cost).
#
#   tests/gpu/bundle.sh B tool//runtime:generate; tests/gpu/spec_draft_bench.sh B [MAX_TOKENS]
set -euo pipefail
# shellcheck source-path=SCRIPTDIR source=../../runtime/engine/spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../../runtime/engine/spec_bench_lib.sh"
gpu_generate "$1"
max_tokens=${2:-256}
c1b=$(mktemp --suffix=.json)
trap 'rm -f "$c1b"' EXIT
llama1b_config "$c1b"
prompt=$(prompts random 1 30000)
run() { # run NAME [FLAGS...]
  local name=$1 line
  shift
  line=$("$gen" --backend=cuda --load_format=dummy --dummy_config=llama3-8b \
    --kv_cache_bytes=$((4 << 30)) --prompt_ids="$prompt" --max_tokens="$max_tokens" \
    --ignore_eos "$@" 2>&1 > /dev/null | tail -1)
  echo "run=$name $line"
}
nvidia-smi -L
run plain
for k in 2 4; do
  run "self K=$k" --speculative_method=draft --num_speculative_tokens="$k" \
    --draft_model=dummy:llama3-8b:0
done
run "1b K=4" --speculative_method=draft --num_speculative_tokens=4 --draft_model="dummy:$c1b:1"
run "1b K=4 fixed" --speculative_method=draft --num_speculative_tokens=4 \
  --draft_model="dummy:$c1b:1" --speculative_adaptive=false
run plain
