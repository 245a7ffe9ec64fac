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
# shellcheck source-path=SCRIPTDIR source=spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/spec_bench_lib.sh"
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
rounds=${3:-2}
small=$(mktemp --suffix=.json)
trap 'rm -f "$small"' EXIT
llama_config "$small" num_hidden_layers=2
for batch in 1 8; do
  p=$(prompts random "$batch" 32000)
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
