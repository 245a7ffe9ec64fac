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
# shellcheck source-path=SCRIPTDIR source=spec_bench_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/spec_bench_lib.sh"
gen=${1:-bazel-bin/runtime/generate}
threads=${2:-1}
shift $(($# < 2 ? $# : 2))
extra=("$@")
v64=$(mktemp --suffix=.json)
trap 'rm -f "$v64"' EXIT
llama_config "$v64" vocab_size=64
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
